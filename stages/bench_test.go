package stages_test

import (
	"context"
	"testing"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/stages"
)

// BenchmarkNativeStageEmpty is the host's whole wrapping of one stage:
// admission, compute lease, the stage, a no-op fence, the idle check of
// the owned stream, release and the trace record. Target: ≤ 1 µs, 0
// allocs.
func BenchmarkNativeStageEmpty(b *testing.B) {
	f := newFixture(b)
	owner := host.NewOwner("bench", nil)
	if _, err := owner.NewStream(f.gpu); err != nil {
		b.Fatal(err)
	}
	sess := stages.NewNative(f.rt, owner, struct{}{}, func(context.Context, *struct{}) error { return nil }, stages.NewNativeConfig())
	stage := func(context.Context, *struct{}) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := sess.Run(ctx, stage); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNativeStageBuiltinFence is the same with the built-in drain
// fence syncing one idle sim stream.
func BenchmarkNativeStageBuiltinFence(b *testing.B) {
	f := newFixture(b)
	owner := host.NewOwner("bench", nil)
	if _, err := owner.NewStream(f.gpu); err != nil {
		b.Fatal(err)
	}
	sess := stages.NewNative(f.rt, owner, struct{}{}, nil, stages.NewNativeConfig())
	stage := func(context.Context, *struct{}) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := sess.Run(ctx, stage); err != nil {
			b.Fatal(err)
		}
	}
}
