//go:build !wasip1

package stagehost

import "embed"

// Sources holds this module's own files: go.mod, the Go sources of every
// package (tests included), and the C header and emulator (c/stagehost.h,
// c/emu.c). `stagehost new` writes them
// into a new guest project so that it builds with no network access (the
// module is not published). The build constraint keeps it, and package
// embed, out of every guest built for wasip1.
//
//go:embed go.mod *.go c/stagehost.h c/emu.c emu fence internal
var Sources embed.FS

// RustSources holds the Rust SDK's crate (rust/Cargo.toml and rust/src),
// which `stagehost new rust` writes into a new project's stagehost-sdk/.
//
//go:embed rust/Cargo.toml rust/src
var RustSources embed.FS
