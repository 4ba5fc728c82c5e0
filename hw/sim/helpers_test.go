package sim_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// patience bounds every wait in these tests: a test that would otherwise
// hang fails after it instead. Nothing is synchronised by sleeping.
const patience = 20 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// rig is a platform with one device and one stream, cleaned up at the end
// of the test.
type rig struct {
	t   testing.TB
	p   *sim.Platform
	dev *sim.Device
	st  *sim.Stream
}

func newRig(t testing.TB, cfgs ...sim.DeviceConfig) *rig {
	t.Helper()
	p := sim.New()
	dev, err := p.AddDevice("dev0", hw.EngineGPU, firstConfig(cfgs))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, p: p, dev: dev}
	r.st = r.stream(dev)
	return r
}

func (r *rig) stream(d *sim.Device) *sim.Stream {
	r.t.Helper()
	s, err := d.NewStream()
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { s.Close(context.Background()) })
	return s.(*sim.Stream)
}

func (r *rig) alloc(d *sim.Device, size int) *sim.Buffer {
	r.t.Helper()
	b, err := d.Alloc(size, hw.AllocHostVisible, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { b.Free() })
	return b.(*sim.Buffer)
}

func (r *rig) prog(d *sim.Device, name string) hw.Program {
	r.t.Helper()
	p, err := d.Prepare(name)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *rig) submit(s *sim.Stream, p hw.Program, args ...hw.Arg) hw.Completion {
	r.t.Helper()
	c, err := s.Submit(&hw.Command{Program: p, Args: args})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) sync(s *sim.Stream) {
	r.t.Helper()
	if err := s.Sync(ctxT(r.t)); err != nil {
		r.t.Fatal(err)
	}
}

func host(t testing.TB, b hw.Buffer) []byte {
	t.Helper()
	m, err := b.HostBytes()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func putF32(b []byte, vals ...float32) {
	for i, v := range vals {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

func getF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:]))
	}
	return out
}

func equalF32(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values %v, want %d values %v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: got %v, want %v (first difference at %d)", what, got, want, i)
		}
	}
}

// wantClass fails unless err is of class, and (if non-empty) mentions
// every one of words.
func wantClass(t testing.TB, err, class error, words ...string) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("got error %v, want class %v", err, class)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not mention %q", err, w)
		}
	}
}

// within runs f in a goroutine and fails the test if it has not returned
// after patience.
func within(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatalf("%s did not return within %v", what, patience)
	}
}

// logKernel records the order in which "test.log" commands run.
var logKernel struct {
	sync.Mutex
	seen map[uint64][]uint64 // by tag (scalar arg 0): values (scalar arg 1)
}

func init() {
	sim.Register("test.log", func(l *sim.Launch) error {
		logKernel.Lock()
		defer logKernel.Unlock()
		if logKernel.seen == nil {
			logKernel.seen = make(map[uint64][]uint64)
		}
		tag := l.Uint(0)
		logKernel.seen[tag] = append(logKernel.seen[tag], l.Uint(1))
		return nil
	})
	sim.Register("test.fail", func(l *sim.Launch) error {
		return errors.New("test.fail always fails")
	})
	sim.Register("test.panic", func(l *sim.Launch) error {
		panic("boom")
	})
	sim.Register("test.floats", func(l *sim.Launch) error {
		l.Float32s(0)
		return nil
	})
}

func logged(tag uint64) []uint64 {
	logKernel.Lock()
	defer logKernel.Unlock()
	return append([]uint64(nil), logKernel.seen[tag]...)
}

// blockStarted[tag] is closed by "test.block" (scalar arg 0 = tag) when
// it starts; the kernel then runs until the device is lost, and returns
// success even then.
var blockStarted sync.Map // uint64 → chan struct{}

func init() {
	sim.Register("test.block", func(l *sim.Launch) error {
		if ch, ok := blockStarted.Load(l.Uint(0)); ok {
			close(ch.(chan struct{}))
		}
		<-l.Lost()
		return nil
	})
}

// firstConfig is cfgs[0], or the default configuration when cfgs is empty.
func firstConfig(cfgs []sim.DeviceConfig) sim.DeviceConfig {
	if len(cfgs) > 0 {
		return cfgs[0]
	}
	return sim.NewDeviceConfig()
}
