package main

import (
	"os"
	"testing"

	"github.com/stagehost/stagehost/hw/cuda"
)

// TestMain makes the test binary the JIT child too: cuda.CompilePTX runs
// the executable it is in with internal-jit (check's PTX verification on
// a GPU machine).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cuda.JITSubcommand {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
