//go:build unix

package fileread

import "syscall"

// openNonBlock opens a named pipe without waiting for a writer, so that
// ReadFile can refuse it instead of blocking.
const openNonBlock = syscall.O_NONBLOCK
