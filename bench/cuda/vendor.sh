#!/usr/bin/env bash
# vendor.sh: a vendor PTX kernel launched from a Wasm stage (stream_launch,
# ABI revision 4) against the same PTX launched from C; target: the Wasm
# path at most 1.1x C per launch.
#
# Build, where Go is (repository root):
#
#	mkdir -p .carry
#	CGO_ENABLED=0 go test -c -o .carry/wasmlaunch.test ./bench/cuda/wasmlaunch
#
# Run, on the GPU machine (CUDA toolkit: nvcc), from the repository root:
#
#	COUNT=5 bench/cuda/vendor.sh
#
# It builds bench/cuda/vendor_launch.c with nvcc, runs it COUNT times
# (1000 launches of "double" over 1024 floats and one sync, per
# repetition), runs BenchmarkWasmVendorLaunch COUNT times (the same 1000
# launches and one sync per stage call, from ../vendor_launch.wasm), and
# prints both medians and their ratio.
set -eu
COUNT=${COUNT:-5}
OUT=${OUT:-/tmp/vendor-run}
mkdir -p "$OUT"
C=$PWD/.carry
PTX=$PWD/hw/cuda/testdata/vendor/double.ptx
export STAGEHOST_REQUIRE_GPU=1
nvcc -O2 -o "$OUT/vendor_launch" bench/cuda/vendor_launch.c -lcuda
"$OUT/vendor_launch" "$PTX" "$COUNT" | tee "$OUT/c.txt"
(cd bench/cuda/wasmlaunch && "$C/wasmlaunch.test" -test.run '^$' -test.bench 'BenchmarkWasmVendorLaunch$' -test.count "$COUNT" -test.benchtime 200x) | tee "$OUT/wasm.txt"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
c=$(awk '/vendor_launch/ {print $2}' "$OUT/c.txt" | median)
w=$(awk '/BenchmarkWasmVendorLaunch/ {for (i=1;i<=NF;i++) if ($(i+1)=="ns/launch") print $i}' "$OUT/wasm.txt" | median)
echo "C:    $c ns/launch (median of $COUNT)"
echo "Wasm: $w ns/launch (median of $COUNT)"
awk -v c="$c" -v w="$w" 'BEGIN {printf "ratio Wasm/C: %.2fx (target <= 1.10x)\n", w/c}'
