package sim_test

import (
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw/sim"
)

// TestKernelInfos: every kernel of the library (everything registered but
// the tests' own test.* and internal.* kernels) has a description, and
// each description is complete.
func TestKernelInfos(t *testing.T) {
	described := map[string]bool{}
	for _, k := range sim.KernelInfos() {
		if err := k.Check(); err != nil {
			t.Error(err)
		}
		described[k.Name] = true
	}
	for _, name := range sim.Kernels() {
		if strings.HasPrefix(name, "test.") || strings.HasPrefix(name, "internal.") {
			continue
		}
		if !described[name] {
			t.Errorf("kernel %q is registered without a description (use registerInfo)", name)
		}
	}
	if !described["mlp_forward"] || !described["matmul"] {
		t.Errorf("described kernels %v lack the library", described)
	}
}
