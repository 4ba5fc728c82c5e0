#!/bin/sh
# Rebuilds the test modules from their text form (wabt's wat2wasm).
set -e
cd "$(dirname "$0")"
for f in *.wat; do
	wat2wasm --debug-names "$f" -o "${f%.wat}.wasm"
done
