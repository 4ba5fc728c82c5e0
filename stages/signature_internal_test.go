package stages

import (
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestCheckSignatureNamesTheKindWithItsArticle: a launch's refusal names
// a scalar kind after its article: "an i32", "an f32", "a u32".
func TestCheckSignatureNamesTheKindWithItsArticle(t *testing.T) {
	p := sim.New()
	defer p.Close()
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	buf, err := dev.Alloc(16, hw.AllocHostVisible, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := &hw.KernelInfo{Name: "mix", Args: []hw.KernelArg{hw.KernelScalar("a", "i32"), hw.KernelScalar("f", "f32"), hw.KernelScalar("u", "u32")}}
	for _, row := range []struct {
		args []hw.Arg
		want string
	}{
		{[]hw.Arg{hw.Uint(1 << 32), hw.Uint(0), hw.Uint(0)}, `kernel "mix": argument 0 (a): 0x100000000 does not fit an i32`},
		{[]hw.Arg{hw.Uint(0), hw.BufferArg(buf, 0, 16), hw.Uint(0)}, `kernel "mix": argument 1 (f) is an f32 scalar, got a buffer`},
		{[]hw.Arg{hw.Uint(0), hw.Uint(0), hw.Uint(1 << 32)}, `kernel "mix": argument 2 (u): 0x100000000 does not fit a u32`},
	} {
		if err := checkSignature(k, row.args); err == nil || !strings.Contains(err.Error(), row.want) {
			t.Errorf("got %v, want %q", err, row.want)
		}
	}
}
