#!/usr/bin/env bash
# run.sh: every GPU check and benchmark of stagehost's CUDA side in one run,
# for a machine with an NVIDIA GPU and the CUDA toolkit (nvcc, ptxas) but
# no Go. Build the test binaries first, where Go is (repository root):
#
#	mkdir -p .carry
#	for p in hw/cuda sessions examples/wasm bench/cuda/wasmlaunch examples/wasm/transformer/block examples/wasm/cnn/net; do
#		CGO_ENABLED=0 go test -c -o .carry/$(basename $p).test ./$p
#	done
#	CGO_ENABLED=0 go test -c -tags block128 -o .carry/block128.test ./examples/wasm/transformer/block
#	CGO_ENABLED=0 go build -o .carry/stagehost ./cmd/stagehost
#	CGO_ENABLED=0 go build -o .carry/opsbench ./bench/cuda/ops
#
# Then, on the GPU machine, from the repository root:
#
#	OUT=/tmp/gpu-run bench/cuda/run.sh
#
# It (1) validates the shipped PTX with ptxas and compares it with nvcc's
# (saving nvcc's, ISA lowered as gen.sh does, as $OUT/kernels.regen.ptx),
# (2) runs every GPU test with STAGEHOST_REQUIRE_GPU=1: hw/cuda, the
# resident sessions R1–R8 on cuda0 + host0, the MLP stage on cuda0 and
# examples/cuda.toml (in Go and through `stagehost run`), the transformer
# block and the CNN examples on cuda0, (3) runs the
# benchmarks COUNT (default 5) times: noop launches from C (launch.c),
# from Go through hw/cuda and from a Wasm stage through the ABI, batches
# and graphs of 64 noops, the resident start-up latency, the MLP stage on
# sim and cuda0, and the op library (bench/cuda/ops against cuBLAS from C,
# bench/cuda/gemm_cublas.c), the transformer block (S=128, D=512) from a
# stage and from Go (BenchmarkBlockCUDA); and (4) prints a table of medians and ratios
# last. Logs land in $OUT (PACK=1: packed into $OUT/logs.tar.gz, beside
# summary.txt).
set -u
OUT=${OUT:-/tmp/gpu-run}
COUNT=${COUNT:-5}
mkdir -p "$OUT"
C=$PWD/.carry
PTX=hw/cuda/kernels/kernels.ptx
status=0
export STAGEHOST_REQUIRE_GPU=1

echo "== machine"
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nvcc --version | tail -n 2
	nproc
} 2>&1 | tee "$OUT/machine.log"

echo "== PTX"
{
	ptxas -arch=sm_90 -o /dev/null "$PTX" && echo "shipped PTX: ptxas ok"
	nvcc -ptx -arch=sm_90 -o "$OUT/kernels.nvcc.ptx" hw/cuda/kernels/kernels.cu &&
		sed 's/^\.version .*/.version 7.8/' "$OUT/kernels.nvcc.ptx" >"$OUT/kernels.regen.ptx" &&
		ptxas -arch=sm_90 -o /dev/null "$OUT/kernels.regen.ptx" && echo "regenerated PTX (ISA 7.8): ptxas ok"
	if diff -q "$OUT/kernels.regen.ptx" "$PTX" >/dev/null; then
		echo "shipped PTX == regenerated"
	else
		echo "shipped PTX differs from regenerated (see $OUT/ptx.diff)"
		diff "$PTX" "$OUT/kernels.regen.ptx" >"$OUT/ptx.diff"
	fi
} >"$OUT/ptx.log" 2>&1
cat "$OUT/ptx.log"
if ! grep -q "shipped PTX: ptxas ok" "$OUT/ptx.log"; then
	echo "shipped PTX fails ptxas: hw/cuda tests use the regenerated one (STAGEHOST_CUDA_PTX)"
	export STAGEHOST_CUDA_PTX="$OUT/kernels.regen.ptx"
	status=1
fi

# gotest NAME DIR LOG LIMIT ARGS...: runs .carry/NAME.test in DIR for at
# most LIMIT seconds, logging to $OUT/LOG.
gotest() {
	local name=$1 dir=$2 log=$3 limit=$4
	shift 4
	(cd "$dir" && timeout "$limit" "$C/$name.test" "$@") >"$OUT/$log" 2>&1 || status=1
}

echo "== tests"
# In hw/cuda: the vendor kernel tests read testdata/vendor; the hostile
# ones (vendor_hostile_gpu_test.go) start processes of their own.
gotest cuda hw/cuda test-cuda.log 150 -test.v -test.count 1 -test.timeout 145s
gotest sessions . test-sessions.log 90 -test.v -test.count 1 -test.run CUDA -test.timeout 85s
gotest wasm examples/wasm test-wasm.log 90 -test.v -test.count 1 -test.run CUDA -test.timeout 85s
gotest wasmlaunch bench/cuda/wasmlaunch test-wasmlaunch.log 40 -test.v -test.count 1 -test.timeout 35s
gotest block examples/wasm/transformer/block test-block.log 90 -test.v -test.count 1 -test.run 'CUDA|Direct' -test.timeout 85s
gotest block128 examples/wasm/transformer/block test-block128.log 90 -test.v -test.count 1 -test.run CUDA -test.timeout 85s
gotest net examples/wasm/cnn/net test-net.log 90 -test.v -test.count 1 -test.run CUDA -test.timeout 85s
timeout 40 "$C/stagehost" run examples/cuda.toml >"$OUT/stagehost-run.log" 2>&1 || status=1
for f in test-cuda test-sessions test-wasm test-wasmlaunch test-block test-block128 test-net; do
	grep -E '^(--- |    --- |ok|PASS|FAIL)|_test.go:[0-9]+: ' "$OUT/$f.log" | grep -v '^=== '
done
echo "-- stagehost run examples/cuda.toml"
cat "$OUT/stagehost-run.log"

echo "== benchmarks (count $COUNT)"
if nvcc -O2 -o /tmp/launch bench/cuda/launch.c -lcuda >"$OUT/bench-c.log" 2>&1; then
	timeout 60 /tmp/launch "$PTX" "$COUNT" >>"$OUT/bench-c.log" 2>&1 || status=1
else
	status=1
fi
gotest cuda . bench-cuda.log 120 -test.run '^$' -test.bench 'LaunchNoop|LaunchSync|GraphNoop|BatchNoop64' -test.count "$COUNT" -test.benchtime 1s
gotest wasmlaunch bench/cuda/wasmlaunch bench-wasmlaunch.log 60 -test.run '^$' -test.bench Noop -test.count "$COUNT" -test.benchtime 1s
gotest sessions . bench-sessions.log 60 -test.run '^$' -test.bench CUDAResidentStartup -test.count "$COUNT" -test.benchtime 300x
gotest wasm examples/wasm bench-wasm.log 60 -test.run '^$' -test.bench MLPStageBackends -test.count "$COUNT" -test.benchtime 1s
cat "$OUT"/bench-*.log | grep -E '^(Benchmark|c_|device)'

echo "== op library: gemm 4096³ and 256 MiB row ops, against cuBLAS from C and a device-to-device copy"
# The C reference needs the toolkit's libraries on the loader's path (the
# Go backend searches the toolkit's directories itself).
if (export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
	nvcc -O2 -o /tmp/gemm_cublas bench/cuda/gemm_cublas.c -lcublas && timeout 60 /tmp/gemm_cublas 4096 20) >"$OUT/ops-ref.txt" 2>&1; then
	cat "$OUT/ops-ref.txt"
else
	status=1
fi
if [ -x "$C/opsbench" ]; then
	timeout 120 "$C/opsbench" -reps 20 -exact-reps 3 -ref "$OUT/ops-ref.txt" >"$OUT/ops-bench.txt" 2>&1 || status=1
	cat "$OUT/ops-bench.txt"
fi
gotest cuda . bench-ops.log 120 -test.run '^$' -test.bench BenchmarkGPUOps -test.count 1 -test.benchtime 20x
gotest wasmlaunch bench/cuda/wasmlaunch bench-wasmgemm.log 90 -test.run '^$' -test.bench WasmGemm -test.count 1 -test.benchtime 5x
gotest block128 examples/wasm/transformer/block bench-block128.log 150 -test.run '^$' -test.bench BlockCUDA -test.count 3 -test.benchtime 100x
grep -h Benchmark "$OUT/bench-ops.log" "$OUT/bench-wasmgemm.log" "$OUT/bench-block128.log"

# med FILE BENCH UNIT: the median of UNIT over BENCH's lines in FILE.
med() {
	awk -v b="$2" -v u="$3" '
		index($1, b) == 1 && (length($1) == length(b) || substr($1, length(b) + 1, 1) == "-") {
			for (i = 2; i < NF; i++) if ($(i + 1) == u) print $i
		}' "$OUT/$1" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR) printf "%.1f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) ; else printf "nan" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "-"; else printf "%.2f", a / b }'; }

c=$(med bench-c.log c_async_launch ns/launch)
go=$(med bench-cuda.log BenchmarkLaunchNoop ns/launch)
wasm=$(med bench-wasmlaunch.log BenchmarkWasmLaunchNoop ns/launch)
wbatch=$(med bench-wasmlaunch.log BenchmarkWasmBatchNoop64 ns/kernel)
gbatch=$(med bench-cuda.log BenchmarkBatchNoop64 ns/kernel)
gdirect=$(med bench-cuda.log BenchmarkBatchNoop64Direct ns/kernel)
ggraph=$(med bench-cuda.log BenchmarkGraphNoop ns/kernel)
cgraph=$(med bench-c.log c_graph_64_noop ns/kernel)
csync=$(med bench-c.log c_launch_sync ns/launch)
gsync=$(med bench-cuda.log BenchmarkLaunchSync ns/op)
rgpu=$(med bench-sessions.log BenchmarkCUDAResidentStartup ns/gpu-observe-p50)
rgpu90=$(med bench-sessions.log BenchmarkCUDAResidentStartup ns/gpu-observe-p90)
rnpu=$(med bench-sessions.log BenchmarkCUDAResidentStartup ns/npu-observe-p50)
msim=$(med bench-wasm.log BenchmarkMLPStageBackends/sim ns/classification)
mcuda=$(med bench-wasm.log BenchmarkMLPStageBackends/cuda ns/classification)
{
	echo "== summary: medians of $COUNT runs (ns); ratios against C's async noop launch unless noted"
	printf '%-58s %10s %8s %s\n' measurement median ratio target
	printf '%-58s %10s %8s %s\n' "noop launch, C (launch.c c_async_launch)" "$c" 1.00 ""
	printf '%-58s %10s %8s %s\n' "noop launch, Go -> driver (BenchmarkLaunchNoop)" "$go" "$(ratio "$go" "$c")" ""
	printf '%-58s %10s %8s %s\n' "noop launch, Wasm stream_submit (BenchmarkWasmLaunchNoop)" "$wasm" "$(ratio "$wasm" "$c")" "<= 1.15"
	printf '%-58s %10s %8s %s\n' "per kernel, Wasm stream_submit_batch x64 (cached graph)" "$wbatch" "$(ratio "$wbatch" "$c")" "<= 0.60"
	printf '%-58s %10s %8s %s\n' "per kernel, Go SubmitBatch x64 (cached graph)" "$gbatch" "$(ratio "$gbatch" "$c")" ""
	printf '%-58s %10s %8s %s\n' "per kernel, Go SubmitBatch x64 (graph cache off)" "$gdirect" "$(ratio "$gdirect" "$c")" ""
	printf '%-58s %10s %8s %s\n' "per kernel, Go RecordGraph x64 replay (GraphNoop)" "$ggraph" "$(ratio "$ggraph" "$c")" ""
	printf '%-58s %10s %8s %s\n' "per kernel, C graph x64 replay" "$cgraph" "$(ratio "$cgraph" "$c")" ""
	printf '%-58s %10s %8s %s\n' "launch + wait, Go (LaunchSync) vs C (c_launch_sync)" "$gsync" "$(ratio "$gsync" "$csync")" "(vs C sync $csync)"
	printf '%-58s %10s %8s %s\n' "resident start: publish RUN -> GPU observed, p50" "$rgpu" "$(ratio "$rgpu" 10000)" "<= 10000 ns (ratio to 10 us)"
	printf '%-58s %10s %8s %s\n' "resident start: publish RUN -> GPU observed, p90" "$rgpu90" "" ""
	printf '%-58s %10s %8s %s\n' "resident start: publish RUN -> host0 observed, p50" "$rnpu" "" ""
	printf '%-58s %10s %8s %s\n' "MLP stage end to end, sim" "$msim" "" ""
	printf '%-58s %10s %8s %s\n' "MLP stage end to end, cuda0" "$mcuda" "$(ratio "$mcuda" "$msim")" "(ratio cuda/sim)"
	echo "tests: $(cat "$OUT"/test-*.log | grep -c -- '--- PASS') passed, $(cat "$OUT"/test-*.log | grep -c -- '--- FAIL') failed, $(cat "$OUT"/test-*.log | grep -c -- '--- SKIP') skipped; exit status $status"
	[ -f "$OUT/ops-bench.txt" ] && cat "$OUT/ops-bench.txt"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
if [ "${PACK:-0}" = 1 ]; then
	# One archive instead of many files, for transports that limit counts.
	(cd "$OUT" && tar czf /tmp/stagehost-logs.tar.gz --exclude summary.txt . &&
		find . -type f ! -name summary.txt -delete && mv /tmp/stagehost-logs.tar.gz logs.tar.gz)
fi
exit $status
