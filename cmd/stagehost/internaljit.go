package main

import (
	"fmt"
	"io"
	"os"

	"github.com/stagehost/stagehost/hw/cuda"
)

// cmdInternalJIT is the hidden `stagehost internal-jit -out FILE`: the
// child process in which the host compiles a vendor kernel's PTX
// (read on stdin) to a cubin, outside the serving process
// (cuda.CompilePTX kills it when its jit_timeout passes). It exits 1
// with the JIT log on stderr when the PTX does not compile.
func cmdInternalJIT(args []string, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "-out" {
		fmt.Fprintln(stderr, "usage: stagehost "+cuda.JITSubcommand+" -out FILE < PTX")
		return exitUsage
	}
	ptx, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<30))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := cuda.RunJIT(ptx, args[1]); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return exitOK
}
