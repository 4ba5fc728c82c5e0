#!/bin/sh
# Rebuilds every snapshot test module from its WAT source with wabt's
# wat2wasm (apt-get install wabt). Run from anywhere.
set -eu
cd "$(dirname "$0")"
for wat in *.wat; do
	wat2wasm -o "${wat%.wat}.wasm" "$wat"
done
