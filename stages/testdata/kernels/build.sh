#!/bin/sh
# Rebuilds the hostile kernel corpus's .wasm files from their .wat
# sources (wabt's wat2wasm: apt-get install wabt).
set -e
cd "$(dirname "$0")"
for f in *.wat; do
	# NAME.wat2wasm.flags: flags for one module (.ci/run reads them too),
	# e.g. --no-check for badtype, which is meant not to validate.
	flags=
	[ -f "${f%.wat}.wat2wasm.flags" ] && flags=$(cat "${f%.wat}.wat2wasm.flags")
	wat2wasm $flags "$f" -o "${f%.wat}.wasm"
done
# The C kernel (docs/guest.md, "Vendor kernels"):
clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -o double_c.wasm double_c.c
