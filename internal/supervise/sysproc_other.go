//go:build unix && !linux

package supervise

import "syscall"

// sysProcAttr puts a worker in a process group of its own, so a terminal's
// Ctrl-C reaches the supervisor only. (No parent-death signal outside
// Linux: a worker may outlive a supervisor that was killed.)
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

const supported = true
