#!/usr/bin/env bash
# gpu-check.sh: runs hw/cuda's GPU checks on a machine with an NVIDIA GPU
# and the CUDA toolkit (nvcc, ptxas) but no Go.
#
# First, where Go is (from the repository root):
#
#	mkdir -p .carry && CGO_ENABLED=0 go test -c -o .carry/cuda.test ./hw/cuda
#
# Then, on the GPU machine, from the repository root:
#
#	OUT=/tmp/gpu-check hw/cuda/gpu-check.sh
#
# It (1) regenerates the PTX from kernels.cu with nvcc and validates both
# the shipped and the regenerated PTX with ptxas, (2) runs every test with
# STAGEHOST_REQUIRE_GPU=1 (so a missing GPU fails instead of skipping),
# (3) runs the launch benchmarks 3 times and the op library's once
# (PROFILE=1: also a CPU profile of
# BenchmarkLaunchSync), (4) builds and runs bench/cuda/launch.c, and prints
# a short table last. Logs land in $OUT. If the shipped PTX fails ptxas,
# everything runs on the regenerated one and the script exits 1.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
T=${CUDA_TEST:-.carry/cuda.test}
PTX=hw/cuda/kernels/kernels.ptx
status=0

{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nvcc --version | tail -n 2
	echo "== nvcc -ptx -arch=sm_90 kernels.cu"
	nvcc -ptx -arch=sm_90 -o "$OUT/kernels.nvcc.ptx" hw/cuda/kernels/kernels.cu && echo ok
	echo "== ptxas shipped $PTX"
	ptxas -arch=sm_90 -v -o /dev/null "$PTX" && echo "shipped PTX: ptxas ok"
	echo "== ptxas regenerated"
	ptxas -arch=sm_90 -o /dev/null "$OUT/kernels.nvcc.ptx" && echo "nvcc PTX: ptxas ok"
} >"$OUT/ptx.log" 2>&1
cat "$OUT/ptx.log"
if ! grep -q "shipped PTX: ptxas ok" "$OUT/ptx.log" && [ -s "$OUT/kernels.nvcc.ptx" ]; then
	echo "WARNING: shipped PTX failed ptxas; every run below uses the nvcc PTX" | tee -a "$OUT/ptx.log"
	PTX="$OUT/kernels.nvcc.ptx"
	export STAGEHOST_CUDA_PTX="$PTX"
	status=1
fi

if [ -s "$OUT/kernels.nvcc.ptx" ]; then
	sed 's/^\.version .*/.version 7.8/' "$OUT/kernels.nvcc.ptx" | diff -q - hw/cuda/kernels/kernels.ptx >/dev/null &&
		echo "shipped PTX == regenerated (ISA lowered to 7.8 as gen.sh does)" | tee -a "$OUT/ptx.log" ||
		echo "shipped PTX differs from regenerated" | tee -a "$OUT/ptx.log"
fi

echo "== tests (shipped PTX)"
# In hw/cuda: the vendor kernel tests read testdata/vendor.
TA=$(realpath "$T")
(cd hw/cuda && STAGEHOST_REQUIRE_GPU=1 timeout 240 "$TA" -test.v -test.count 1 -test.timeout 230s) >"$OUT/test.log" 2>&1 || status=1
grep -E '^(--- |ok|PASS|FAIL)|gpu_test.go|scenario_test.go' "$OUT/test.log"

echo "== benchmarks"
STAGEHOST_REQUIRE_GPU=1 timeout 180 "$T" -test.run '^$' -test.bench 'Launch|Batch|Graph|MLP' -test.count 3 -test.benchtime 1s \
	>"$OUT/bench.log" 2>&1 || status=1
# The op library's (256 MiB tensors, gemm at 4096³): once, 20 launches each.
STAGEHOST_REQUIRE_GPU=1 timeout 120 "$T" -test.run '^$' -test.bench GPUOps -test.count 1 -test.benchtime 20x \
	>>"$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"

if [ "${PROFILE:-0}" = 1 ]; then
	echo "== CPU profile of BenchmarkLaunchSync"
	STAGEHOST_REQUIRE_GPU=1 timeout 60 "$T" -test.run '^$' -test.bench 'LaunchSync' -test.benchtime 3s \
		-test.cpuprofile "$OUT/cpu.prof" 2>&1 | grep -E '^Benchmark'
fi

echo "== C launch benchmark"
if nvcc -O2 -o /tmp/launch bench/cuda/launch.c -lcuda >"$OUT/launch-c.log" 2>&1; then
	timeout 90 /tmp/launch "$PTX" >>"$OUT/launch-c.log" 2>&1 || status=1
else
	status=1
fi
cat "$OUT/launch-c.log"

{
	echo "== summary (ns; Go = hw/cuda through purego, C = bench/cuda/launch.c)"
	awk '/^Benchmark/ { for (i = 3; i < NF; i++) if ($(i+1) ~ /^ns\//) { m[$1 " " $(i+1)] = m[$1 " " $(i+1)] " " $i } }
		END { for (k in m) printf "go  %-48s %s\n", k, m[k] }' "$OUT/bench.log" | sort
	awk '/^c_/ { m[$1 " " $3] = m[$1 " " $3] " " $2 } END { for (k in m) printf "c   %-48s %s\n", k, m[k] }' "$OUT/launch-c.log" | sort
	grep -hE 'surfaced|round trip|Store32Release|PrimaryCtxReset|reopen' "$OUT/test.log" | sed 's/^ *//'
	echo "tests: $(grep -c '^--- PASS' "$OUT/test.log") passed, $(grep -c '^--- FAIL' "$OUT/test.log") failed, $(grep -c '^--- SKIP' "$OUT/test.log") skipped; exit status $status"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $status
