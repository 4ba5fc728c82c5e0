package sim

import (
	"errors"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

func init() {
	// internal.block closes the channel started (a package variable set
	// by the test) and runs until the device is lost.
	Register("internal.block", func(l *Launch) error {
		close(blockStarted)
		<-l.Lost()
		return nil
	})
}

var blockStarted chan struct{}

// TestLoseReleasesGrownRing loses the device while a grown ring holds
// queued commands and the worker holds the first one in the old ring,
// either hung before running it or inside its kernel. Every pin must be
// dropped exactly once: the freed buffer ends with no pins, not a negative
// count (released twice) nor a positive one (leaked).
func TestLoseReleasesGrownRing(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	for _, running := range []bool{false, true} {
		p := New()
		d, _ := p.AddDevice("d", hw.EngineGPU, NewDeviceConfig().WithInitialQueueDepth(2).WithQueueDepth(64))
		hs, _ := d.NewStream()
		s := hs.(*Stream)
		hb, _ := d.Alloc(16, hw.AllocHostVisible, nil)
		b := hb.(*Buffer)
		fill, _ := d.Prepare("fill")
		arg := hw.BufferArg(b, 0, -1)
		if running {
			blockStarted = make(chan struct{})
			block, _ := d.Prepare("internal.block")
			if _, err := s.Submit(&hw.Command{Program: block, Args: []hw.Arg{arg}}); err != nil {
				t.Fatal(err)
			}
			<-blockStarted
		} else {
			s.Inject(Fault{Kind: Hang})
		}
		var last hw.Completion
		for range 40 {
			c, err := s.Submit(&hw.Command{Program: fill, Args: []hw.Arg{arg, hw.Float32(1)}})
			if err != nil {
				t.Fatal(err)
			}
			last = c
		}
		s.mu.Lock()
		size := len(s.ring)
		s.mu.Unlock()
		if size != 64 {
			t.Fatalf("ring of %d slots after 41 commands, want 64", size)
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		d.Lose("test")
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Fatal("worker still running after the loss")
		}
		if got := b.region.state.Load(); got != freedBit {
			t.Fatalf("running %v: region state %d after the loss, want %d (freed, no pins)", running, got, freedBit)
		}
		if err := last.Wait(callCtx); !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatalf("last command: %v", err)
		}
		s.Close(callCtx)
	}
}
