//go:build !unix

package supervise

import (
	"errors"
	"os"
	"syscall"
)

func closeOnExec(int) {}

func terminate(*os.Process) error { return errors.New("supervise: SIGTERM needs a Unix system") }

func exitSignal(*os.ProcessState) syscall.Signal { return 0 }

func signalName(sig syscall.Signal) string { return sig.String() }
