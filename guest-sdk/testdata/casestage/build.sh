#!/bin/sh
# Builds casestage.wasm with Debian's rustc 1.63 (the committed module's
# toolchain), offline:  ./build.sh [--check]
set -eu
cd "$(dirname "$0")"
# Built where the checkout's path cannot reach the bytes
# (guest-sdk/rust/build-wasm.sh).
out=$(mktemp -d)/casestage.wasm
../../rust/build-wasm.sh guest-sdk/testdata/casestage casestage "$out"
if [ "${1:-}" = "--check" ]; then
  cmp -s "$out" casestage.wasm || { echo "guest-sdk/testdata/casestage/casestage.wasm differs from a fresh build" >&2; exit 1; }
else
  cp "$out" casestage.wasm
  chmod a-x casestage.wasm
fi
