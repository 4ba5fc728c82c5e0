// Package fence lets a Go guest ship a custom fence: the stagehost_fence
// export (ABI.md §4.4). Import it only in a module that has a fence: the
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
// The export returns stagehost.StatusOf of the fence's result (the status
// of the first *stagehost.Error in the error's chain, 1 for an error without
// one), and the host reads it as ABI.md §4.4 says:
//
//   - nil (0): the fence drained the session's work.
//   - an error of status FAULT, such as the error Stream.Sync returns when a
//     command failed on the device: the fence drained the work, but device
//     work failed. The session is not quarantined; the call fails with
//     Fault (a stage's own client error is reported instead, naming the
//     failure). So the example's `return s.Sync()` agrees with the host: a
//     FAULT from Sync means drained with failed work, not a failed fence.
//   - any other error (logged at error level), such as NOT_FOUND from
//     LookupStream, DEADLINE_EXCEEDED from Sync, or an error without a
//     status: the fence failed, and the host quarantines the session.
//
// A panic (a trap) or running past the fence deadline fails the fence too,
// and so does returning nil or a FAULT error while a stream of the session
// still has work: the host checks every stream after the fence, so a fence
// must drain every stream the stages use, not only s0. If the module links
// this package but never calls Register, the export fails: a fence that
// cannot prove anything must not claim success.
//
// A FAULT is never lost by returning nil instead: the host records every
// FAULT that stream_sync reports, to a stage or to a fence, and fails the
// call with Fault whatever the fence returns. Beware of joining errors: a
// fence that returns errors.Join(faultErr, otherErr) reports FAULT, the
// first status in the chain, and does not quarantine the session on
// otherErr's account.
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
