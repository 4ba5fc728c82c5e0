#!/usr/bin/env bash
# hostile.sh: the hostile vendor kernels on the GPU (hw/cuda,
# vendor_hostile_gpu_test.go), each test REPEAT (3) times, each run in a
# process of its own under a hard `timeout` of LIMIT (120) seconds, then
# one table of what they logged:
#
#   - cross read (TestGPUCrossProcessRead): a vendor kernel reads through
#     another process's device pointer: "fault" (CUDA_ERROR_ILLEGAL_ADDRESS,
#     with the time from the launch to the fault) or "own memory" (the
#     address is this process's own at that virtual address; never the
#     secret);
#   - hang (TestGPUHangKilled): a spinning kernel in another process,
#     killed: the noop launch+sync baseline and during the hang (medians;
#     the min during the hang and how many of its 50 were under 3x the
#     baseline, which would fool the recovery's rule if many were),
#     the reap (SIGKILL to Wait), the recovery (SIGKILL to the first of 20
#     consecutive noops under 3x the baseline; target 200 ms) and the max
#     latency seen while recovering;
#   - each row of TestGPUHostileLaunch: its outcome (the fault at sync and
#     when, or refused at submit).
#
# Build where Go is (repository root):
#
#	mkdir -p .carry/bin
#	CGO_ENABLED=0 go test -c -o .carry/bin/cuda.test ./hw/cuda
#
# Then on the GPU machine, from the repository root:
#
#	OUT=/tmp/hostile bench/cuda/hostile.sh
#
# The logs are $OUT/<test>-<run>.log, the table $OUT/hostile.txt. It exits
# with the last failed run's status (its log says why; 124: it ran past
# LIMIT), 0 when all passed. TABLE_ONLY=1 makes the table again from the
# logs in $OUT, running nothing.
set -u
OUT=${OUT:-/tmp/hostile}
REPEAT=${REPEAT:-3}
LIMIT=${LIMIT:-120}
BIN=$PWD/.carry/bin/cuda.test
mkdir -p "$OUT"
[ -x "$BIN" ] || [ -n "${TABLE_ONLY:-}" ] || { echo "no $BIN: build it first (see the header)"; exit 2; }
export STAGEHOST_REQUIRE_GPU=1
TESTS="TestGPUCrossProcessRead TestGPUHangKilled TestGPUHostileLaunch"
worst=0
if [ -n "${TABLE_ONLY:-}" ]; then
	echo 0 >"$OUT/.rc" # the table from the logs already in $OUT
else {
	echo "== $(date -u +%FT%TZ) repeat=$REPEAT limit=${LIMIT}s"
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	for i in $(seq "$REPEAT"); do
		for t in $TESTS; do
			log=$OUT/$t-$i.log
			# The test binary reads testdata/ relative to its package.
			(cd hw/cuda && timeout -k 5 "$LIMIT" "$BIN" -test.run "^$t\$" -test.v -test.count 1 -test.timeout "$((LIMIT - 5))s") >"$log" 2>&1
			rc=$?
			echo "run $i $t: exit $rc"
			[ $rc -ne 0 ] && { grep -E -- '--- FAIL|FAIL|panic' "$log" | head -5; worst=$rc; }
		done
	done
	echo "$worst" >"$OUT/.rc"
} 2>&1 | tee "$OUT/runs.txt"; fi
worst=$(cat "$OUT/.rc")

# field LOG PATTERN: the text after "verdict: " on the first line matching
# PATTERN, or "-" (a run that failed before its verdict).
verdict() { grep -h -- "$2" "$1" 2>/dev/null | head -1 | sed 's/.*verdict: //'; }
{
	echo
	echo "| run | cross read | noop baseline / during the hang | reap | recovery (target 200 ms) | max latency | store_0x10 | trap | shared over limit | grid over limit |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	for i in $(seq "$REPEAT"); do
		c=$OUT/TestGPUCrossProcessRead-$i.log
		h=$OUT/TestGPUHangKilled-$i.log
		l=$OUT/TestGPUHostileLaunch-$i.log
		cross=$(verdict "$c" 'verdict: ' | sed -E 's/^fault: (CUDA_ERROR_[A-Z_]+) ([^ ]+) after the launch.*/fault (\1), \2 after the launch/; s/^own memory: (.*), not the secret, in ([^ ]+).*/own memory (\1), \2/')
		base=$(grep -h 'noop launch+sync: baseline' "$h" 2>/dev/null | head -1 | sed -E 's/.*baseline ([^ ]+) .*during the hang ([^ ]+) \(median of 50, ([0-9]+x); min ([^,]+), ([0-9]+) of 50 .*/\1 \/ \2 (\3; min \4; \5 of 50 fast)/')
		hang=$(verdict "$h" 'verdict: reaped')
		reap=$(echo "$hang" | sed -nE 's/^reaped ([^ ]+) after SIGKILL.*/\1/p')
		rec=$(echo "$hang" | sed -nE 's/.*recovered ([^ ]+) after SIGKILL.*target 200ms ([a-z]+).*/\1 (\2)/p')
		mx=$(echo "$hang" | sed -nE 's/.*max latency ([^)]+)\).*/\1/p')
		# row NAME: the verdict of TestGPUHostileLaunch/NAME, from its own process's output.
		row() {
			awk -v r="TestGPUHostileLaunch/$1 in a process of its own" 'index($0, r) {on=1} on && /verdict: / {sub(/.*verdict: /, ""); print; exit}' "$l" 2>/dev/null |
				sed -E 's/^fault (CUDA_ERROR_[A-Z_]+) at sync, ([^ ]+) after the launch.*/fault \1, \2/; s/^refused at submit, nothing enqueued, the stream works after:.*launch shape: (.*)/refused (\1)/'
		}
		r1=$(row store_0x10) r2=$(row trap) r3=$(row shared_over_limit) r4=$(row grid_over_limit)
		echo "| $i | ${cross:--} | ${base:--} | ${reap:--} | ${rec:--} | ${mx:--} | ${r1:--} | ${r2:--} | ${r3:--} | ${r4:--} |"
	done
	echo
	grep -h -- '^--- \(PASS\|FAIL\|SKIP\): TestGPU' "$OUT"/TestGPU*.log | sed 's/ (.*//' | sort | uniq -c
	[ "$worst" -eq 0 ] && echo "all runs passed" || echo "a run failed (exit $worst): see $OUT/*.log"
} | tee "$OUT/hostile.txt"
exit "$worst"
