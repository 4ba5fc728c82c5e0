#!/usr/bin/env bash
# Rebuilds the benchmark modules. Needs wat2wasm (Debian package wabt) for
# the .wat modules, and clang with wasm-ld (Debian: clang lld) for the C
# ones.
#
#   ./build.sh          rebuild every .wasm next to its source
#   ./build.sh --check  rebuild the C modules into a temporary directory and
#                       fail if a committed .wasm differs (the .wat modules
#                       are checked by .ci/run)
set -euo pipefail
cd "$(dirname "$0")"
check=false
[ "${1:-}" = "--check" ] && check=true
out=.
if $check; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
else
  for f in *.wat; do wat2wasm "$f" -o "${f%.wat}.wasm"; done
fi
status=0
for f in *.c; do
  clang --target=wasm32 -O2 -nostdlib -I../../../guest-sdk/c -Wl,--no-entry -o "$out/${f%.c}.wasm" "$f"
  chmod a-x "$out/${f%.c}.wasm"
  if $check && ! cmp -s "${f%.c}.wasm" "$out/${f%.c}.wasm"; then
    echo "stages/testdata/bench/${f%.c}.wasm differs from a fresh build of $f" >&2
    status=1
  fi
done
exit $status
