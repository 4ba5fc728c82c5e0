#!/usr/bin/env bash
# mlp.sh: the MLP stage's latency on the GPU (issue 9), and optionally every
# gated GPU test, in one run on a machine with an NVIDIA GPU but no Go.
# Build the binaries first, where Go is (repository root):
#
#	mkdir -p .carry-mlp
#	for p in hw/cuda sessions examples/wasm; do
#		CGO_ENABLED=0 go test -c -o .carry-mlp/$(basename $p).test ./$p
#	done
#	CGO_ENABLED=0 go build -o .carry-mlp/stagehost ./cmd/stagehost
#	# optional: the stage as it was before, run side by side
#	git show f038cc6:examples/wasm/mlp/stage/mlp.wasm >.carry-mlp/mlp-before.wasm
#
# Then, on the GPU machine, from the repository root:
#
#	OUT=/tmp/mlp-run COUNT=5 TESTS=1 bench/cuda/mlp.sh
#
# It runs (NVCC=1, where nvcc and ptxas are) a check of the shipped PTX
# with ptxas and a regeneration from kernels.cu as gen.sh does, into
# $OUT/kernels.ptx, compared with the shipped file; (TESTS=1) the hw/cuda
# tests, the resident R-tests on CUDA, the MLP stage and manifest tests on
# cuda0 and `stagehost run examples/cuda.toml`, all with
# STAGEHOST_REQUIRE_GPU=1; then COUNT times BenchmarkMLPCall (the stage's
# device work from Go: old and new call shape, upload staging on and off,
# the six-kernel batch or one mlp_forward launch) and
# BenchmarkMLPStageBackends (the whole host path on sim and cuda0: six
# kernels or mlp_forward, built-in fence or the fence module, the empty Go
# guest, and the before build if carried), each 20000 calls; (PROFILE=1) a
# CPU profile of cuda/fused into $OUT/cpu-cuda-fused.prof; and prints the
# medians of p50 and p99 last. PACK=1 packs the logs into $OUT/logs.tgz
# (the device tool brings back at most 8 files).
set -u
OUT=${OUT:-/tmp/mlp-run}
COUNT=${COUNT:-5}
N=${N:-20000}
mkdir -p "$OUT"
C=$PWD/.carry-mlp
status=0
export STAGEHOST_REQUIRE_GPU=1

{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nproc
	uptime
} >"$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

gotest() { # gotest NAME DIR LOG LIMIT ARGS...
	local name=$1 dir=$2 log=$3 limit=$4
	shift 4
	(cd "$dir" && timeout "$limit" "$C/$name.test" "$@") >"$OUT/$log" 2>&1 || status=1
}

if [ "${NVCC:-0}" = 1 ]; then
	PATH=$PATH:/usr/local/cuda/bin
	{
		nvcc --version | tail -2
		ptxas -arch=sm_90 -o /dev/null hw/cuda/kernels/kernels.ptx && echo "shipped PTX: ptxas ok" || echo "shipped PTX: ptxas FAILED"
		nvcc -ptx -arch=sm_90 -o "$OUT/kernels.ptx" hw/cuda/kernels/kernels.cu &&
			sed -i 's/^\.version .*/.version 7.8/' "$OUT/kernels.ptx" &&
			ptxas -arch=sm_90 -o /dev/null "$OUT/kernels.ptx" && echo "regenerated PTX (ISA 7.8): ptxas ok" || echo "regenerated PTX: FAILED"
		cmp -s "$OUT/kernels.ptx" hw/cuda/kernels/kernels.ptx && echo "shipped PTX == regenerated" || echo "shipped PTX != regenerated"
	} >"$OUT/ptx.log" 2>&1
	cat "$OUT/ptx.log"
fi

if [ "${TESTS:-0}" = 1 ]; then
	gotest cuda hw/cuda test-cuda.log 120 -test.v -test.count 1 -test.timeout 110s
	gotest sessions sessions test-sessions.log 90 -test.v -test.count 1 -test.run CUDA -test.timeout 85s
	gotest wasm examples/wasm test-wasm.log 90 -test.v -test.count 1 -test.run 'CUDA|Cuda|GPU' -test.timeout 85s
	if [ -x "$C/stagehost" ]; then # optional: the carry limit may leave it out
		timeout 60 "$C/stagehost" run examples/cuda.toml >"$OUT/stagehost-run.log" 2>&1 || status=1
	fi
	for f in test-cuda test-sessions test-wasm; do
		grep -E '^(--- |    --- |ok|PASS|FAIL)' "$OUT/$f.log" | grep -v -- '--- PASS' | grep -v '^=== '
		echo "$f: $(grep -c -- '--- PASS' "$OUT/$f.log") passed, $(grep -c -- '--- FAIL' "$OUT/$f.log") failed, $(grep -c -- '--- SKIP' "$OUT/$f.log") skipped"
	done
	grep -E 'cuda_test.go:|gpu_test.go:' "$OUT/test-wasm.log" "$OUT/test-cuda.log" | head -20
	[ -f "$OUT/stagehost-run.log" ] && head -12 "$OUT/stagehost-run.log"
fi

before=""
[ -f "$C/mlp-before.wasm" ] && before="$C/mlp-before.wasm"
gotest cuda hw/cuda bench-call.log 200 -test.run '^$' -test.bench MLPCall -test.count "$COUNT" -test.benchtime "${N}x"
(export STAGEHOST_MLP_WASM_BEFORE=$before
	gotest wasm examples/wasm bench-stage.log 240 -test.run '^$' -test.bench MLPStageBackends -test.count "$COUNT" -test.benchtime "${N}x")
if [ "${PROFILE:-0}" = 1 ]; then
	gotest wasm examples/wasm bench-profile.log 120 -test.run '^$' -test.bench 'MLPStageBackends/cuda/fused$' -test.count 1 \
		-test.benchtime 40000x -test.cpuprofile "$OUT/cpu-cuda-fused.prof"
fi
if [ -x "$C/probe.test" ]; then # host-function times per call (a local, uncommitted build)
	(cd examples/wasm && MLPWASM_BEFORE=$before timeout 120 "$C/probe.test" -test.run ZZProbe -test.v) >"$OUT/probe.log" 2>&1
	grep -v -E '^\s+(entry_name|input_|output_)' "$OUT/probe.log" | head -60
fi
grep -E '^Benchmark' "$OUT"/bench-*.log

# med FILE BENCH UNIT: the median of UNIT over BENCH's lines in FILE.
med() {
	awk -v b="$2" -v u="$3" '
		index($1, b) == 1 && (length($1) == length(b) || substr($1, length(b) + 1, 1) == "-") {
			for (i = 2; i < NF; i++) if ($(i + 1) == u) print $i
		}' "$OUT/$1" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR) printf "%.0f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) ; else printf "-" }'
}
{
	echo "== summary: medians of $COUNT runs of $N calls (ns per call)"
	printf '%-52s %9s %9s %9s\n' measurement mean p50 p99
	for b in before sync-read read read/eager-events read/staging-off fused fused/staging-off fused/graph; do
		printf '%-52s %9s %9s %9s\n' "device work from Go, $b" "$(med bench-call.log BenchmarkMLPCall/$b ns/op)" \
			"$(med bench-call.log BenchmarkMLPCall/$b p50-ns)" "$(med bench-call.log BenchmarkMLPCall/$b p99-ns)"
	done
	for b in sim sim/fused sim/fence-module sim/fused+fence-module sim/minimal \
		cuda cuda/fused cuda/fence-module cuda/fused+fence-module cuda/minimal before/sim before/cuda; do
		printf '%-52s %9s %9s %9s\n' "MLP stage end to end, $b" "$(med bench-stage.log BenchmarkMLPStageBackends/$b ns/classification)" \
			"$(med bench-stage.log BenchmarkMLPStageBackends/$b p50-ns)" "$(med bench-stage.log BenchmarkMLPStageBackends/$b p99-ns)"
	done
	echo "exit status $status"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
if [ "${PACK:-0}" = 1 ]; then
	(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
fi
exit $status
