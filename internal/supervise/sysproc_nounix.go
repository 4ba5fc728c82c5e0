//go:build !unix

package supervise

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

// supported is false: workers are signalled (SIGTERM) and given a report
// descriptor (exec.Cmd.ExtraFiles), which only Unix systems offer.
const supported = false
