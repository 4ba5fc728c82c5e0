#!/usr/bin/env bash
# weights.sh: loading weights onto the GPU (BenchmarkWeightsLoad in
# bench/cuda/weightsload): a generated safetensors file of MIB MiB (1024)
# read as a stream, hashed and uploaded through two 8 MiB pinned staging
# buffers (cuda/load), against one plain copy of the same bytes from
# pinned memory (cuda/pinned-copy), with the time and the peak resident
# memory each adds; sim/* are the same on the simulator. Build where Go
# is (repository root):
#
#	mkdir -p .carry/bin
#	CGO_ENABLED=0 go test -c -o .carry/bin/weightsload.test ./bench/cuda/weightsload
#
# Then on the GPU machine, from the repository root:
#
#	OUT=/tmp/weights bench/cuda/weights.sh
#
# Each sub-benchmark runs in a process of its own (the peak resident
# memory is the process's), COUNT (3) times, COUNT_X (3) loads each, with
# STAGEHOST_REQUIRE_GPU=1 (a missing GPU fails). The generated file goes
# to DIR (the system's temporary directory). The log is
# $OUT/weights.log; the table (medians) is printed last and written to
# $OUT/weights.md.
set -u
OUT=${OUT:-/tmp/weights}
MIB=${MIB:-1024}
COUNT=${COUNT:-3}
COUNT_X=${COUNT_X:-3}
BIN=${BIN:-$PWD/.carry/bin/weightsload.test}
mkdir -p "$OUT"
export STAGEHOST_REQUIRE_GPU=1 STAGEHOST_WEIGHTS_MIB=$MIB
[ -n "${DIR:-}" ] && export STAGEHOST_WEIGHTS_DIR=$DIR
LOG=$OUT/weights.log
: >"$LOG"
{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
	nproc
} | tee -a "$LOG"
status=0
for sub in cuda/load cuda/pinned-copy sim/load sim/pinned-copy; do
	for _ in $(seq "$COUNT"); do
		(cd bench/cuda/weightsload && timeout 300 "$BIN" -test.run '^$' \
			-test.bench "^BenchmarkWeightsLoad\$/^${sub%%/*}\$/^${sub#*/}\$" \
			-test.benchtime "${COUNT_X}x") >>"$LOG" 2>&1 || status=1
	done
done
# The table: median ns/op, MB/s and peak-rss-added-MiB of each.
awk -v mib="$MIB" '
/^BenchmarkWeightsLoad\// {
	name = $1; sub(/^BenchmarkWeightsLoad\//, "", name); sub(/-[0-9]+$/, "", name)
	n[name]++; t[name, n[name]] = $3; mb[name, n[name]] = $5; rss[name, n[name]] = $7
}
function med(a, name, k,   i, j, v, tmp, c) {
	c = k
	for (i = 1; i <= c; i++) v[i] = a[name, i] + 0
	for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { tmp = v[i]; v[i] = v[j]; v[j] = tmp }
	return v[int((c + 1) / 2)]
}
END {
	printf "| %d MiB | time per load | throughput | peak RSS added |\n|---|---|---|---|\n", mib
	split("cuda/load cuda/pinned-copy sim/load sim/pinned-copy", order, " ")
	for (i = 1; i <= 4; i++) {
		s = order[i]
		if (!(s in n)) { printf "| %s | (no result) | | |\n", s; continue }
		printf "| %s | %.3f s | %.0f MB/s | %.0f MiB |\n", s, med(t, s, n[s]) / 1e9, med(mb, s, n[s]), med(rss, s, n[s])
	}
}' "$LOG" | tee "$OUT/weights.md"
exit $status
