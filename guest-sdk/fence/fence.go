// Package fence lets a Go guest ship a custom fence: the stagehost_fence
// export (ABI.md §4.3). Import it only in a module that has a fence: the
// export's presence makes the host call it after every stage instead of its
// built-in fence, which syncs every stream of the session.
//
// A fence module (one that provides only a fence) or a stage module with
// its own fence calls Register from an init function:
//
//	func init() {
//		fence.Register(func() error {
//			s, err := stagehost.LookupStream("s0")
//			if err != nil {
//				return err
//			}
//			return s.Sync()
//		})
//	}
//
// The fence returns nil when it has drained the session's work. A returned
// error (logged at error level) makes the export return non-zero, and the
// host quarantines the session; so does a panic, which traps. If the module
// links this package but never calls Register, the export fails: a fence
// that cannot prove anything must not claim success.
package fence

import "github.com/stagehost/stagehost/guest-sdk/internal/host"

// Register makes fn the module's fence. It panics on a nil fn or a second
// Register.
func Register(fn func() error) {
	if fn == nil {
		panic("fence: Register: nil function")
	}
	if host.Fence() != nil {
		panic("fence: Register: a fence is already registered")
	}
	host.SetFence(fn)
}
