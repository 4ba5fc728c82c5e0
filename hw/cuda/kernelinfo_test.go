package cuda

import (
	"reflect"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestKernelInfos: every kernel of the module has a complete description,
// and for every kernel the simulator has too, both take the same
// arguments in the same order: names, kinds, types, directions and
// length rules.
func TestKernelInfos(t *testing.T) {
	infos := KernelInfos()
	if len(infos) != len(kernels) {
		t.Fatalf("KernelInfos has %d kernels, the table %d", len(infos), len(kernels))
	}
	byName := map[string]hw.KernelInfo{}
	for _, k := range infos {
		if err := k.Check(); err != nil {
			t.Error(err)
		}
		byName[k.Name] = k
	}
	shared := 0
	for _, s := range sim.KernelInfos() {
		c, ok := byName[s.Name]
		if !ok {
			continue
		}
		shared++
		if s.Variadic != c.Variadic || !reflect.DeepEqual(s.Args, c.Args) {
			t.Errorf("%s: sim and cuda disagree on the arguments:\nsim  %+v\ncuda %+v", s.Name, s.Args, c.Args)
		}
	}
	if shared < 9 {
		t.Errorf("only %d kernels in both backends", shared)
	}
}
