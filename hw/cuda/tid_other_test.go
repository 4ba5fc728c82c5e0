//go:build !linux

package cuda

// gettid is unavailable here: the fake driver then treats every call as
// coming from one thread and cannot check the threading discipline.
func gettid() int { return 0 }
