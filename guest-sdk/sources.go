//go:build !wasip1

package stagehost

import "embed"

// Sources holds this module's own files: go.mod, the Go sources of every
// package (tests included), and c/stagehost.h. `stagehost new` writes them
// into a new guest project so that it builds with no network access (the
// module is not published). The build constraint keeps it, and package
// embed, out of every guest built for wasip1.
//
//go:embed go.mod *.go c/stagehost.h emu fence internal
var Sources embed.FS
