package supervise

import "syscall"

// sysProcAttr puts a worker in a process group of its own, so a terminal's
// Ctrl-C reaches the supervisor only and the supervisor alone decides how
// workers stop, and has the kernel SIGKILL it if the supervisor dies (a
// worker never outlives its supervisor). Pdeathsig fires when the thread
// that started the worker exits; the Go runtime keeps its threads unless a
// goroutine exits locked to one, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

const supported = true
