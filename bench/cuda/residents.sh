#!/usr/bin/env bash
# residents.sh: N resident starts in a row through `stagehost serve` on a
# GPU (issue 10 item 4): no start may hang, and the resident GPU
# participants parked on cuda0 may never exceed its max_parked. Build
# where Go is (repository root):
#
#	mkdir -p .carry/bin
#	CGO_ENABLED=0 go build -o .carry/bin/stagehost ./cmd/stagehost
#	CGO_ENABLED=0 go build -o .carry/bin/residents ./bench/cuda/residents
#
# Then on the GPU machine, from the repository root:
#
#	OUT=/tmp/residents bench/cuda/residents.sh
#
# BACKEND=sim runs the same on sim devices (a dry run anywhere). N (100)
# starts, ROUNDS (200000) exchange rounds per run, so that runs stay
# parked long enough for the bound to matter, MAX_PARKED (32). Everything
# runs under a hard `timeout` of LIMIT (150) seconds; the log is
# $OUT/residents.log, serve's log $OUT/serve.log, and the table is
# printed last.
set -u
OUT=${OUT:-/tmp/residents}
N=${N:-100}
ROUNDS=${ROUNDS:-200000}
MAX_PARKED=${MAX_PARKED:-32}
LIMIT=${LIMIT:-150}
BACKEND=${BACKEND:-cuda}
ADDR=${ADDR:-127.0.0.1:18080}
BIN=$PWD/.carry/bin
mkdir -p "$OUT"
M=$OUT/residents.toml
if [ "$BACKEND" = cuda ]; then
	GPU='backend = "cuda"
engine = "gpu"
index = 0'
	NPU='backend = "cuda"
engine = "cpu"'
else
	GPU='backend = "sim"
engine = "gpu"'
	NPU='backend = "sim"
engine = "npu"'
fi
cat >"$M" <<TOML
version = 1

[runtime]
cache_dir = "off"

[[device]]
name = "gpu0"
$GPU
max_parked = $MAX_PARKED

[[device]]
name = "host0"
$NPU

[[resident]]
name = "pp"
gpu = "gpu0"
npu = "host0"
rounds = $ROUNDS
join_deadline = "30s"
max_runs = $N
history = $N
TOML

{
	echo "== $(date -u +%FT%TZ) backend=$BACKEND N=$N rounds=$ROUNDS max_parked=$MAX_PARKED"
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	timeout -k 5 "$LIMIT" bash -c '
		"$0/stagehost" serve "$1" --addr "$2" >"$3/serve.log" 2>&1 &
		pid=$!
		"$0/residents" -addr "$2" -resident pp -device gpu0 -n "$4" -bound "$5" -wait 90s
		rc=$?
		kill -TERM $pid 2>/dev/null
		for i in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
		kill -0 $pid 2>/dev/null && { echo "serve did not exit within 10s of SIGTERM"; kill -KILL $pid; rc=3; }
		exit $rc
	' "$BIN" "$M" "$ADDR" "$OUT" "$N" "$MAX_PARKED"
	rc=$?
	echo "== exit $rc (124: the hard timeout of ${LIMIT}s fired)"
} 2>&1 | tee "$OUT/residents.log"
tail -3 "$OUT/serve.log" 2>/dev/null | cut -c1-300
