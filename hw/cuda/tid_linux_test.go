package cuda

import "syscall"

// gettid identifies the calling OS thread, so the fake driver can check
// that every stream call runs on the thread that made its context current.
func gettid() int { return syscall.Gettid() }
