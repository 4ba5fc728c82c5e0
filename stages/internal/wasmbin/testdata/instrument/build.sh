#!/bin/sh
# Rebuilds the test modules from their text form (wabt's wat2wasm), with
# the flags in wat2wasm.flags (which .ci/run uses too).
set -e
cd "$(dirname "$0")"
for f in *.wat; do
	wat2wasm $(cat wat2wasm.flags) "$f" -o "${f%.wat}.wasm"
done
