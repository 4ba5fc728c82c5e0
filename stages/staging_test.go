package stages

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// uploadSession is a session of many_uploads (16 uploads of 64 KiB per
// call) on a sim GPU whose commands each take a millisecond, so that
// uploads are still queued when the arena outgrows itself.
func uploadSession(t *testing.T) *Session {
	t.Helper()
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	t.Cleanup(func() { p.Close() })
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	eng := engineForTest(t)
	bin, err := os.ReadFile(filepath.Join("testdata", "abi", "many_uploads.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName("uploads"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("uploads", gpu).WithStreams("s0").WithBuffer("big", 1<<20).WithBudget(2 << 20)
	s, err := eng.NewSession(context.Background(), rt, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Uploads are staged in host-visible memory of the session's device (on
// CUDA page-locked, which the driver uploads from without a copy of its
// own); the arenas a call outgrew, with its uploads still queued, are
// freed once its fence proved them retired, the last one when the session
// closes. The budget is not charged for them.
func TestUploadsAreStagedInHostVisibleMemory(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	s := uploadSession(t)
	used := s.Owner().Budget().Used()
	for range 2 {
		out, err := s.Run(ctx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range out {
			if int(b) != i || len(out) != 16 {
				t.Fatalf("read back %v: an upload's staged bytes were lost", out)
			}
		}
	}
	st := &s.native.state
	if st.arenaBuf == nil {
		t.Fatal("the uploads were staged in Go memory")
	}
	h, err := st.arenaBuf.HostBytes()
	if err != nil || &h[0] != &st.arena[:1][0] {
		t.Fatalf("the arena is not the host-visible buffer's memory (%v)", err)
	}
	if len(st.oldArenas) != 0 {
		t.Fatalf("%d outgrown arenas kept after a proven fence", len(st.oldArenas))
	}
	if got := s.Owner().Budget().Used(); got != used {
		t.Fatalf("budget %d, %d before: the staging was charged", got, used)
	}
	buf := st.arenaBuf
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := buf.Free(); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("the arena was not freed by Close: Free gives %v", err)
	}
}

// A quarantined session keeps its staging memory: the device may still
// read an upload from it.
func TestQuarantinedSessionKeepsItsStaging(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	s := uploadSession(t)
	if _, err := s.Run(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	buf := s.native.state.arenaBuf
	s.native.quarantineOwner(errors.New("test"), nil, nil)
	if err := s.Close(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("Close of a quarantined session: %v", err)
	}
	if err := buf.Free(); err != nil {
		t.Fatalf("the quarantined session's arena was freed: %v", err)
	}
}
