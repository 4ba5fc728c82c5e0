package stages

import (
	"context"
	"testing"
	"time"
)

func BenchmarkProbeLoops(b *testing.B) {
	for _, lm := range loopModules {
		bin := benchBytes(b, lm.name)
		for _, plain := range []bool{true, false} {
			name := lm.name + "/instr"
			if plain {
				name = lm.name + "/plainhost"
			}
			b.Run(name, func(b *testing.B) {
				cfg := NewEngineConfig().WithCacheDir("")
				cfg.uninterruptible = plain
				eng, _ := NewEngine(context.Background(), cfg)
				f := newWasmFixture(b)
				f.eng = eng
				fn, c := hostCall(b, f, bin, lm.name, lm.export)
				stack := []uint64{lm.arg}
				for b.Loop() {
					c.ArmWithCancel(context.Background(), time.Now().Add(time.Minute))
					stack[0] = lm.arg
					if err := fn.CallWithStack(c, stack); err != nil {
						b.Fatal(err)
					}
					c.Disarm()
				}
			})
		}
	}
}
