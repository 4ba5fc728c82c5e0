package cuda

import "syscall"

// childProcAttr has the kernel SIGKILL a test's child process when the
// thread that started it exits, so a child that spins on the GPU never
// outlives its test (startRole starts it from a goroutine locked to its
// thread until the child has been reaped).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
