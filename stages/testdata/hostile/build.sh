#!/bin/sh
# Rebuilds every hostile test module from its WAT source with wabt's
# wat2wasm (apt-get install wabt). Run from anywhere.
set -eu
cd "$(dirname "$0")"
command -v wat2wasm >/dev/null 2>&1 || {
	echo "build.sh: wat2wasm not found (install wabt)" >&2
	exit 1
}
for wat in *.wat; do
	wat2wasm -o "${wat%.wat}.wasm" "$wat"
done
