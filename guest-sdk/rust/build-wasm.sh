#!/bin/sh
# build-wasm.sh PKG_DIR NAME OUT: builds the cdylib NAME of the cargo
# package in PKG_DIR (a path relative to the repository root that depends
# on guest-sdk/rust by a relative path) for wasm32-unknown-unknown with
# Debian's rustc 1.63 (RUSTC and CARGO pick others), offline, and copies
# NAME.wasm to OUT.
#
# The bytes must not depend on where the repository is checked out:
# cargo derives the crates' metadata hashes (and so symbol names) from the
# packages' absolute paths, which --remap-path-prefix does not cover. So
# the SDK and the package are copied to one fixed directory and built
# there, with that directory remapped as well.
set -eu
pkg=$1 name=$2 out=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
fixed=/tmp/stagehost-rust-build-$(id -u)
rm -rf "$fixed"
mkdir -p "$fixed/guest-sdk" "$fixed/$pkg"
cp -R "$root/guest-sdk/rust" "$fixed/guest-sdk/rust"
rm -rf "$fixed/guest-sdk/rust/target"
(cd "$root/$pkg" && tar cf - --exclude=./target .) | (cd "$fixed/$pkg" && tar xf -)
(cd "$fixed/$pkg" && RUSTFLAGS="--remap-path-prefix=$fixed=stagehost" RUSTC=${RUSTC:-/usr/bin/rustc} CARGO_TARGET_DIR="$fixed/target" \
  "${CARGO:-/usr/bin/cargo}" build --offline --quiet --release --target wasm32-unknown-unknown)
cp "$fixed/target/wasm32-unknown-unknown/release/$name.wasm" "$out"
chmod a-x "$out"
rm -rf "$fixed"
