#!/usr/bin/env bash
# tenants.sh: two tenants on one GPU under `stagehost serve --supervise`:
# session a of tenant acme (fault_stage: input byte 1 launches the CUDA
# "fault" kernel, an illegal address) and session b of tenant beta (the
# good stage, noop), each in a worker process of its own on cuda0
# (workers cuda0-acme and cuda0-beta). Each round makes acme's device
# fault; b is called all along. It prints, per fault: how a's faulting
# call was answered and when, the time until acme's worker is ready and
# a serves again, and b's calls during it (count, failures, p50, p99,
# max: the max is the GPU's recovery as b saw it). None of b's calls may
# fail, and beta's worker must not restart.
#
# Build where Go is (repository root):
#
#	mkdir -p .carry/bin
#	CGO_ENABLED=0 go build -o .carry/bin/stagehost ./cmd/stagehost
#	CGO_ENABLED=0 go build -o .carry/bin/supervise ./bench/cuda/supervise
#
# Then on the GPU machine, from the repository root:
#
#	OUT=/tmp/tenants bench/cuda/tenants.sh
#
# The same on the GPU as a Go test (TestServeSuperviseTenantsGPU: it
# fails where it would skip, with STAGEHOST_REQUIRE_GPU=1), pre-built too:
#
#	CGO_ENABLED=0 go test -c -o .carry/bin/stagehost.test ./cmd/stagehost
#	(cd cmd/stagehost && STAGEHOST_TEST_BINARY=$PWD/../../.carry/bin/stagehost \
#	  STAGEHOST_REQUIRE_GPU=1 ../../.carry/bin/stagehost.test -test.run 'TenantsGPU' -test.v)
#
# TESTS=1 runs it after the faults below.
#
# BACKEND=sim is a dry run anywhere (a SIGKILL of acme's worker instead
# of the fault kernel). REPEAT (3) faults in a row; acme's max_failures
# is set above REPEAT so that it is never quarantined here. Everything
# runs under a hard `timeout` of LIMIT (240) seconds; the logs are
# $OUT/tenants.log and $OUT/serve.log.
set -u
OUT=${OUT:-/tmp/tenants}
REPEAT=${REPEAT:-3}
LIMIT=${LIMIT:-240}
BACKEND=${BACKEND:-cuda}
ADDR=${ADDR:-127.0.0.1:18082}
BIN=$PWD/.carry/bin
ROOT=$PWD
mkdir -p "$OUT"
M=$OUT/tenants.toml
if [ "$BACKEND" = cuda ]; then
	GPU='backend = "cuda"
engine = "gpu"
index = 0'
	PROGRAMS='["fault", "noop"]'
	MODE=kernel
else
	GPU='backend = "sim"
engine = "gpu"'
	PROGRAMS='["noop"]'
	MODE=kill
fi
sha() { sha256sum "$1" | cut -d' ' -f1; }
cat >"$M" <<TOML
version = 1

[runtime]
cache_dir = "off"

[[device]]
name = "cuda0"
$GPU

[[module]]
name = "fault_stage"
path = "$ROOT/bench/cuda/fault_stage.wasm"
sha256 = "$(sha "$ROOT/bench/cuda/fault_stage.wasm")"

[[module]]
name = "good"
path = "$ROOT/stages/testdata/hostile/good_stage.wasm"
sha256 = "$(sha "$ROOT/stages/testdata/hostile/good_stage.wasm")"

[[tenant]]
name = "acme"
max_failures = $((REPEAT + 10))

[[tenant]]
name = "beta"

[[session]]
name = "a"
stage = "fault_stage"
device = "cuda0"
programs = $PROGRAMS
tenant = "acme"

[[session]]
name = "b"
stage = "good"
device = "cuda0"
programs = ["noop"]
tenant = "beta"
TOML

{
	echo "== $(date -u +%FT%TZ) backend=$BACKEND mode=$MODE repeat=$REPEAT"
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	timeout -k 5 "$LIMIT" bash -c '
		"$0/stagehost" serve "$1" --supervise --addr "$2" --log-level info >"$3/serve.log" 2>&1 &
		pid=$!
		rc=0
		for i in $(seq "$5"); do
			echo "== fault $i"
			"$0/supervise" -addr "$2" -mode "$4" -gpu-session a -gpu-worker cuda0-acme -host-session b -host-worker cuda0-beta -wait 60s || { rc=1; break; }
		done
		kill -TERM $pid 2>/dev/null
		for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
		kill -0 $pid 2>/dev/null && { echo "serve --supervise did not exit within 20s of SIGTERM"; kill -KILL $pid; rc=3; }
		exit $rc
	' "$BIN" "$M" "$ADDR" "$OUT" "$MODE" "$REPEAT"
	rc=$?
	echo "== exit $rc (124: the hard timeout of ${LIMIT}s fired)"
	if [ -n "${TESTS:-}" ]; then
		echo "== TestServeSuperviseTenantsGPU"
		(cd "$ROOT/cmd/stagehost" && STAGEHOST_TEST_BINARY="$BIN/stagehost" STAGEHOST_REQUIRE_GPU=1 \
			timeout -k 5 "$LIMIT" "$BIN/stagehost.test" -test.run 'TenantsGPU' -test.v -test.count 1)
		echo "== test exit $?"
	fi
	pgrep -fa "stagehost serve" && echo "== processes left over (above)"
} 2>&1 | tee "$OUT/tenants.log"
tail -3 "$OUT/serve.log" 2>/dev/null | cut -c1-300
