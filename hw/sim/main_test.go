package sim_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run if stream workers outlive the tests: every test
// closes its streams or loses its device, and both stop the worker.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if stacks := leakedWorkers(); stacks != "" {
			fmt.Fprintf(os.Stderr, "leaked stream workers:\n%s\n", stacks)
			code = 1
		}
	}
	os.Exit(code)
}

func leakedWorkers() string {
	// Workers of lost devices exit asynchronously: give them a moment
	// (yielding, not sleeping) before calling them leaked.
	deadline := time.Now().Add(patience)
	for {
		buf := make([]byte, 1<<20)
		all := string(buf[:runtime.Stack(buf, true)])
		var leaked []string
		for g := range strings.SplitSeq(all, "\n\n") {
			if strings.Contains(g, "sim.(*Stream).run") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		runtime.Gosched()
	}
}
