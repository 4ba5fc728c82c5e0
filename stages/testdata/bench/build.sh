#!/usr/bin/env bash
# Rebuilds the benchmark modules. Needs wat2wasm (Debian package wabt).
set -euo pipefail
cd "$(dirname "$0")"
for f in *.wat; do wat2wasm "$f" -o "${f%.wat}.wasm"; done
