#!/usr/bin/env bash
# Rebuilds every example module next to its source.
#
#   ./build.sh          rebuild all .wasm files
#   ./build.sh --check  rebuild into a temporary directory and fail if any
#                       committed .wasm differs (same Go and clang versions
#                       needed: the outputs depend on the toolchain)
#
# Go guests use the SDK's documented command,
#   GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o X.wasm .
# run in the example's folder, plus -trimpath and -buildvcs=false so that
# the committed bytes do not depend on the checkout's path or git state.
# C guests need clang and wasm-ld (Debian: apt-get install -y clang lld).
# The Rust guest needs Debian's rustc and cargo with the wasm32 standard
# library (apt-get install -y rustc cargo libstd-rust-dev-wasm32): the
# committed bytes are rustc 1.63's; RUSTC and CARGO pick others.
set -euo pipefail
cd "$(dirname "$0")"
# Each Go example is its own module; build it as such, not through the
# repository's go.work, so the bytes depend only on its own go.mod.
export GOWORK=off
here=$(pwd)

check=false
if [ "${1:-}" = "--check" ]; then
  check=true
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

target() { # target DIR NAME: where NAME.wasm built in DIR goes
  if $check; then echo "$out/$2.wasm"; else echo "$here/$1/$2.wasm"; fi
}

go_example() { # go_example DIR NAME [TAGS]: TAGS (build tags) default to none
  (cd "$1" && GOOS=wasip1 GOARCH=wasm go build -tags "${3:-}" -buildmode=c-shared -trimpath -buildvcs=false -o "$(target "$1" "$2")" .)
}

requires() { # requires DIR NAME: write DIR/requires.toml into NAME.wasm as its
  # stagehost.requires section (abi/ABI.md §7), with the CLI of this checkout
  (cd "$here/../.." && go run ./cmd/stagehost requires set "$(target "$1" "$2")" "$here/$1/requires.toml" -o "$(target "$1" "$2")" >/dev/null)
}

c_example() { # c_example DIR NAME
  (cd "$1" && clang --target=wasm32 -O2 -nostdlib -I"$here/../../guest-sdk/c" \
    -Wl,--no-entry -o "$(target "$1" "$2")" "$2.c" && chmod a-x "$(target "$1" "$2")")
}

rust_example() { # rust_example DIR NAME: cargo's cdylib NAME.wasm, offline,
  # built where the checkout's path cannot reach the bytes
  "$here/../../guest-sdk/rust/build-wasm.sh" "examples/wasm/$1" "$2" "$(target "$1" "$2")"
}

echo "go: $(go version)"
go_example minimal minimal
go_example mlp/stage mlp
go_example transformer/stage transformer
go_example transformer/stage transformer128 block128 # S=128, D=512: for BenchmarkBlockCUDA
go_example cnn/stage cnn
go_example digits/stage digits
requires digits/stage digits
go_example fence fence
go_example weights weights
if command -v clang >/dev/null; then
  echo "clang: $(clang --version | head -n1)"
  c_example cstage cstage
else
  echo "clang not found: cstage not rebuilt (apt-get install -y clang lld)" >&2
  $check && exit 1
fi

if [ -x "${RUSTC:-/usr/bin/rustc}" ]; then
  echo "rustc: $("${RUSTC:-/usr/bin/rustc}" --version)"
  rust_example rust softmax
else
  echo "${RUSTC:-/usr/bin/rustc} not found: rust/softmax.wasm not rebuilt (apt-get install -y rustc cargo libstd-rust-dev-wasm32)" >&2
  $check && exit 1
fi

if $check; then
  status=0
  for f in minimal/minimal mlp/stage/mlp transformer/stage/transformer transformer/stage/transformer128 cnn/stage/cnn digits/stage/digits fence/fence cstage/cstage rust/softmax; do
    if ! cmp -s "$f.wasm" "$out/$(basename "$f").wasm"; then
      echo "$f.wasm differs from a fresh build" >&2
      status=1
    fi
  done
  exit $status
fi
ls -l minimal/minimal.wasm mlp/stage/mlp.wasm transformer/stage/transformer.wasm transformer/stage/transformer128.wasm cnn/stage/cnn.wasm digits/stage/digits.wasm fence/fence.wasm cstage/cstage.wasm rust/softmax.wasm
