#!/usr/bin/env bash
# Runs the CPU benchmarks that must also be measured on the 16-core GPU
# host, from test binaries built on a machine with Go:
#
#   mkdir -p .carry
#   (cd bench/extism && GOWORK=off CGO_ENABLED=0 go test -c -o ../../.carry/extism.test .)
#   CGO_ENABLED=0 go test -c -o .carry/stages.test ./stages
#
# then, on the host, from the repository root: bench/cpu16.sh [COUNT]
# Logs go to $OUT (or ./.out); a short summary is printed last.
set -euo pipefail
count=${1:-5}
out=${OUT:-.out}
mkdir -p "$out"
root=$(pwd)
nproc > "$out/nproc.txt"
(cd bench/extism && "$root/.carry/extism.test" -test.run '^$' -test.bench 'EmptyStage' -test.count "$count" -test.benchmem) | tee "$out/extism.txt"
(cd stages && "$root/.carry/stages.test" -test.run '^$' \
  -test.bench 'InterruptLoops|InterruptDeadlineToReturn|InterruptGCWhileSpinning|WasmStageEmpty$' \
  -test.count "$count" -test.benchmem) | tee "$out/stages.txt"
echo "== summary ($(nproc) CPUs)"
grep -h '^Benchmark' "$out/extism.txt" "$out/stages.txt" | awk '{print $1, $3, $4, $5, $6, $7, $8, $9}' | sort | awk '
  { k=$1; v[k]=v[k] " " $2 } END { for (k in v) print k, v[k] }' | sort
