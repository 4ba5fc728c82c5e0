//go:build !linux

package cuda

import "syscall"

// childProcAttr: without Pdeathsig a child is bounded by its own time
// limit (roleLimit) and the test's kill in t.Cleanup only.
func childProcAttr() *syscall.SysProcAttr { return nil }
