package sim_test

import (
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestPreparedKernelNamesTheKindWithItsArticle: a prepared kernel's
// submit check names a scalar kind after its article ("an f32").
func TestPreparedKernelNamesTheKindWithItsArticle(t *testing.T) {
	r := newRig(t)
	info := hw.KernelInfo{Name: "test.mix", Args: []hw.KernelArg{hw.KernelScalar("f", "f32")}}
	prog, err := r.dev.PrepareKernel(info, func(*sim.Launch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	buf, err := r.dev.Alloc(16, hw.AllocHostVisible, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.st.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(buf, 0, 16)}})
	if want := `kernel "test.mix": argument 0 (f) is an f32 scalar, got a buffer`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
}
