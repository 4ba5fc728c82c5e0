#!/usr/bin/env bash
# supervise.sh: `stagehost serve --supervise` on a GPU machine (issue 11):
# a cuda0 worker and a host0 worker (the CUDA host device) serve a session
# each; a kernel fault in the cuda0 worker (the "fault" kernel: an illegal
# address, sticky for its process) must restart that worker only, the
# host0 session must answer throughout, and the cuda0 session must serve
# again; the client reports the time from the fault to serving again.
# Build where Go is (repository root):
#
#	mkdir -p .carry/bin
#	CGO_ENABLED=0 go build -o .carry/bin/stagehost ./cmd/stagehost
#	CGO_ENABLED=0 go build -o .carry/bin/supervise ./bench/cuda/supervise
#
# Then on the GPU machine, from the repository root:
#
#	OUT=/tmp/supervise bench/cuda/supervise.sh
#
# BACKEND=sim is a dry run anywhere (sim devices, and a SIGKILL of the
# GPU worker instead of the fault kernel, which sim does not have).
# REPEAT (3) faults in a row, each measured; then five runs of the
# resident pp (gpu0 with host0 as its npu) started through the
# supervisor, which routes them over the lattice to gpu0's worker.
# TRACING=1 adds a [tracing] table: every process appends its spans to
# $OUT/spans.json. Everything runs under a hard
# `timeout` of LIMIT (240) seconds; the logs are $OUT/supervise.log and
# $OUT/serve.log, and the tables are printed last.
set -u
OUT=${OUT:-/tmp/supervise}
REPEAT=${REPEAT:-3}
LIMIT=${LIMIT:-240}
BACKEND=${BACKEND:-cuda}
ADDR=${ADDR:-127.0.0.1:18081}
BIN=$PWD/.carry/bin
ROOT=$PWD
mkdir -p "$OUT"
M=$OUT/supervise.toml
if [ "$BACKEND" = cuda ]; then
	GPU='backend = "cuda"
engine = "gpu"
index = 0'
	HOST='backend = "cuda"
engine = "cpu"'
	PROGRAMS='["fault", "noop"]'
	MODE=kernel
else
	GPU='backend = "sim"
engine = "gpu"'
	HOST='backend = "sim"
engine = "npu"'
	PROGRAMS='["noop"]'
	MODE=kill
fi
sha() { sha256sum "$1" | cut -d' ' -f1; }
TRACING_TABLE=
if [ -n "${TRACING:-}" ]; then
	TRACING_TABLE="[tracing]
exporter = \"file\"
file = \"$OUT/spans.json\"
"
	rm -f "$OUT/spans.json"
fi
cat >"$M" <<TOML
version = 1
$TRACING_TABLE

[runtime]
cache_dir = "off"

[[device]]
name = "gpu0"
$GPU

[[device]]
name = "host0"
$HOST

[[module]]
name = "fault_stage"
path = "$ROOT/bench/cuda/fault_stage.wasm"
sha256 = "$(sha "$ROOT/bench/cuda/fault_stage.wasm")"

[[module]]
name = "good"
path = "$ROOT/stages/testdata/hostile/good_stage.wasm"
sha256 = "$(sha "$ROOT/stages/testdata/hostile/good_stage.wasm")"

[[session]]
name = "gpu"
stage = "fault_stage"
device = "gpu0"
programs = $PROGRAMS

[[session]]
name = "host"
stage = "good"
device = "host0"
programs = ["noop"]

[[resident]]
name = "pp"
gpu = "gpu0"
npu = "host0"
rounds = 64
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
			"$0/supervise" -addr "$2" -mode "$4" -wait 60s || { rc=1; break; }
		done
		if [ $rc = 0 ]; then
			echo "== resident pp through the supervisor, after the faults"
			"$0/supervise" -addr "$2" -mode resident -resident pp -starts 5 -wait 60s || rc=2
		fi
		kill -TERM $pid 2>/dev/null
		for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
		kill -0 $pid 2>/dev/null && { echo "serve --supervise did not exit within 20s of SIGTERM"; kill -KILL $pid; rc=3; }
		exit $rc
	' "$BIN" "$M" "$ADDR" "$OUT" "$MODE" "$REPEAT"
	rc=$?
	echo "== exit $rc (124: the hard timeout of ${LIMIT}s fired)"
	pgrep -fa "stagehost serve" && echo "== processes left over (above)"
} 2>&1 | tee "$OUT/supervise.log"
tail -3 "$OUT/serve.log" 2>/dev/null | cut -c1-300
