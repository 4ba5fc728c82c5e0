#!/usr/bin/env bash
# Runs the CPU benchmarks that must also be measured on the 16-core GPU
# host, from test binaries built on a machine with Go:
#
#   mkdir -p .carry
#   (cd bench/extism && GOWORK=off CGO_ENABLED=0 go test -c -o ../../.carry/extism.test .)
#   CGO_ENABLED=0 go test -c -o .carry/stages.test ./stages
#   CGO_ENABLED=0 go test -c -o .carry/lattice.test ./internal/lattice
#   CGO_ENABLED=0 go test -c -o .carry/deploy.test ./deploy
#
# then, on the host, from the repository root: bench/cpu16.sh [COUNT]
# SUITES (default "extism stages lattice pool") picks the suites; a suite
# whose test binary is missing is skipped with a line saying so.
# Logs go to $OUT (or ./.out); a short summary is printed last.
set -euo pipefail
count=${1:-5}
out=${OUT:-.out}
suites=${SUITES:-extism stages lattice pool}
mkdir -p "$out"
root=$(pwd)
nproc > "$out/nproc.txt"
# run SUITE DIR BINARY BENCH: one suite's benchmarks, from DIR.
run() {
  if [ ! -x "$root/.carry/$3" ]; then
    echo "== $1: skipped, .carry/$3 is missing"
    return
  fi
  (cd "$2" && "$root/.carry/$3" -test.run '^$' -test.bench "$4" -test.count "$count" -test.benchmem) | tee "$out/$1.txt"
}
for s in $suites; do
  case $s in
  extism) run extism bench/extism extism.test 'EmptyStage' ;;
  stages) run stages stages stages.test 'InterruptLoops|InterruptDeadlineToReturn|InterruptGCWhileSpinning|WasmStageEmpty$' ;;
  lattice) run lattice internal/lattice lattice.test 'CallOverhead|Throughput' ;;
  pool) run pool deploy deploy.test 'PoolThroughput' ;;
  *) echo "unknown suite $s"; exit 2 ;;
  esac
done
echo "== summary ($(nproc) CPUs; medians of $count runs)"
for f in "$out"/*.txt; do
  case $f in */nproc.txt) continue ;; esac
  grep -h '^Benchmark' "$f" || true
done | awk '{
  k=$1; sub(/-[0-9]+$/, "", k)
  for (i = 3; i < NF; i += 2) { m=k " " $(i+1); n[m]++; v[m, n[m]]=$i }
} END {
  for (m in n) {
    c=n[m]; for (i = 1; i <= c; i++) a[i]=v[m, i]
    for (i = 1; i <= c; i++) for (j = i+1; j <= c; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
    print m, a[int((c+1)/2)]
  }
}' | sort
