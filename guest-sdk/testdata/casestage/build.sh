#!/bin/sh
# Builds casestage.wasm with Debian's rustc 1.63 (the committed module's
# toolchain), offline:  ./build.sh [--check]
set -eu
cd "$(dirname "$0")"
# The checkout's path must not reach the bytes: remap it.
root=$(cd ../../.. && pwd)
RUSTFLAGS="--remap-path-prefix=$root=stagehost" RUSTC=${RUSTC:-/usr/bin/rustc} CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} \
  ${CARGO:-/usr/bin/cargo} build --offline -q --release --target wasm32-unknown-unknown
out=${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/release/casestage.wasm
if [ "${1:-}" = "--check" ]; then
  cmp -s "$out" casestage.wasm || { echo "guest-sdk/testdata/casestage/casestage.wasm differs from a fresh build" >&2; exit 1; }
else
  cp "$out" casestage.wasm
  chmod a-x casestage.wasm
fi
