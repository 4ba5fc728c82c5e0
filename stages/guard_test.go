package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

func abiModule(t testing.TB, f *wasmFixture, name string) *Module {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join("testdata", "abi", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.eng.Load(context.Background(), bin, SHA256(bin), NewLoadConfig().WithName(name))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEntryNameWritesOnlyWhatTheABISays checks entry_name's out-parameter
// rule: a destination too small gets the length only, an out-of-memory
// destination gets nothing written.
func TestEntryNameWritesOnlyWhatTheABISays(t *testing.T) {
	f := newWasmFixture(t)
	s := f.session(t, abiModule(t, f, "entry_name"), NewSessionConfig("entry", f.gpu))
	out, err := s.RunEntry(context.Background(), "predict", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	u32 := func(i int) uint32 { return binary.LittleEndian.Uint32(out[4*i:]) }
	if len(out) != 4*6+16 {
		t.Fatalf("output is %d bytes, want 40", len(out))
	}
	if got := abi.Status(u32(0)); got != abi.StatusOutOfBounds || u32(1) != 7 {
		t.Errorf("dst too small: status %v, length word %#x; want OUT_OF_BOUNDS and 7", got, u32(1))
	}
	if got := abi.Status(u32(2)); got != abi.StatusOK || u32(3) != 7 {
		t.Errorf("dst large enough: status %v, length word %#x; want OK and 7", got, u32(3))
	}
	if name := out[16:32]; !bytes.Equal(name[:7], []byte("predict")) || name[7] != 0xBB {
		t.Errorf("name bytes % x, want \"predict\" and nothing more", name)
	}
	if got := abi.Status(u32(8)); got != abi.StatusOutOfBounds || u32(9) != 0xAAAAAAAA {
		t.Errorf("dst outside memory: status %v, length word %#x; want OUT_OF_BOUNDS and untouched 0xaaaaaaaa", got, u32(9))
	}
}

// TestCloseWhileACallRunsIsBusyAndKeepsTheInstance holds a stage inside a
// stream_sync on a hung command, closes the session meanwhile (ErrBusy,
// nothing closed), then lets the stage finish normally.
func TestCloseWhileACallRunsIsBusyAndKeepsTheInstance(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "good_stage"), f.defaultConfig("busy").WithDeadline(time.Hour).WithFenceTimeout(time.Hour))
	stream := s.Owner().Streams()[0].(*sim.Stream)
	release := stream.Inject(sim.Fault{Kind: sim.Hang})
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(callCtx, nil, nil)
		done <- err
	}()
	for stream.Idle() { // until the stage has submitted its command
		runtime.Gosched()
	}
	if err := s.Close(callCtx); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("Close during a call = %v, want ErrBusy", err)
	}
	if _, err := s.Run(callCtx, nil, nil); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("a concurrent Run = %v, want ErrBusy", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("the running call failed after a refused Close: %v", err)
	}
	if _, err := s.Run(callCtx, nil, nil); err != nil {
		t.Fatalf("a call after the refused Close: %v", err)
	}
	if err := s.Close(callCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run(callCtx, nil, nil); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}

// TestReplacementsIsSafeToReadDuringCalls reads the replacement counter
// while trapping calls replace instances; the race detector fails this
// test if the counter is not synchronised.
func TestReplacementsIsSafeToReadDuringCalls(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "trap_stage"), f.defaultConfig("trap"))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = s.Replacements()
				runtime.Gosched()
			}
		}
	})
	for range 5 {
		if _, err := s.Run(callCtx, nil, nil); !errors.Is(err, errdefs.ErrFault) {
			t.Errorf("Run = %v, want a trap (Fault)", err)
		}
	}
	close(stop)
	wg.Wait()
	if got := s.Replacements(); got != 5 {
		t.Fatalf("Replacements = %d after 5 traps, want 5", got)
	}
}

// TestFreedBufferStaysUntilTheFenceProvesItIdle frees a buffer whose
// command is still queued (the stream hangs it): until the fence has
// proven the command retired, the session's owner keeps the buffer
// allocated and charged; after the call it is released. (The sim backend
// also keeps a buffer's memory while a command uses it; real devices do
// not, which is why the host must.)
func TestFreedBufferStaysUntilTheFenceProvesItIdle(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	s := f.session(t, abiModule(t, f, "free_in_flight"), f.defaultConfig("free").WithDeadline(time.Hour).WithFenceTimeout(time.Hour))
	budget := s.Owner().Budget()
	before, owned := budget.Used(), s.Owner().Buffers()
	stream := s.Owner().Streams()[0].(*sim.Stream)
	release := stream.Inject(sim.Fault{Kind: sim.Hang})
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(callCtx, nil, nil)
		done <- err
	}()
	for stream.Submitted() < 2 { // the second submission follows the free
		runtime.Gosched()
	}
	if got, n := budget.Used(), s.Owner().Buffers(); got != before+4096 || n != owned+1 {
		t.Errorf("while the command is queued: %d bytes charged, %d buffers owned; want %d and %d (the freed buffer still held)", got, n, before+4096, owned+1)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, n := budget.Used(), s.Owner().Buffers(); got != before || n != owned {
		t.Errorf("after the fence: %d bytes charged, %d buffers owned; want %d and %d (the buffer released)", got, n, before, owned)
	}
}

// TestFenceFallsBackToTheDrainWhenItsInstanceCannotBeMade: after a trap,
// the module's own fence needs a new instance, whose init spins; the host
// drains with the built-in fence instead, so the trapped call is a Fault
// without quarantine, and the next call finds the session failed.
func TestFenceFallsBackToTheDrainWhenItsInstanceCannotBeMade(t *testing.T) {
	callCtx := testutil.Context(t, time.Minute) // for calls that can block
	f := newWasmFixture(t)
	cfg := f.defaultConfig("fallback").WithInitTimeout(100 * time.Millisecond).WithDeadline(time.Hour).WithFenceTimeout(time.Hour)
	s := f.session(t, f.mustLoad(t, "loop_init_on_replace_fence"), cfg)
	if _, err := s.Run(callCtx, nil, nil); !errors.Is(err, errdefs.ErrFault) || errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("call 1 = %v, want the trap (Fault), not a quarantine", err)
	}
	if err := s.Quarantined(); err != nil {
		t.Fatalf("quarantined although the built-in drain proved the fence: %v", err)
	}
	_, err := s.Run(callCtx, nil, nil)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "stagehost_init") {
		t.Fatalf("call 2 = %v, want DeadlineExceeded naming stagehost_init (the session failed)", err)
	}
}

// TestYieldUnwindsOnDeadlineOrCancellationOnly calls the instrumentation's
// host function directly: it returns a new countdown while the entry's
// deadline and its caller's context hold, and unwinds (panics with an
// interruption naming the cause) once either has ended.
func TestYieldUnwindsOnDeadlineOrCancellationOnly(t *testing.T) {
	yield := func(c *callContext) (fuel uint64, cause error) {
		defer func() {
			if v := recover(); v != nil {
				intr, ok := v.(*interruption)
				if !ok {
					t.Fatalf("yield panicked with %v, want an interruption", v)
				}
				cause = intr.cause
			}
		}()
		stack := []uint64{0}
		hostYield(c, nil, stack)
		return stack[0], nil
	}
	var c callContext
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()

	c.ArmWithCancel(parent, time.Now().Add(time.Hour))
	if fuel, cause := yield(&c); cause != nil || fuel != yieldFuel {
		t.Fatalf("live entry: fuel %d, cause %v; want %d and no unwinding", fuel, cause, yieldFuel)
	}
	cancel()
	if _, cause := yield(&c); !errors.Is(cause, context.Canceled) {
		t.Fatalf("after the caller cancelled: cause %v, want context.Canceled", cause)
	}
	c.Disarm()

	c.ArmWithCancel(context.Background(), time.Now().Add(-time.Millisecond))
	if _, cause := yield(&c); !errors.Is(cause, context.DeadlineExceeded) {
		t.Fatalf("past the deadline: cause %v, want context.DeadlineExceeded", cause)
	}
	c.Disarm()
}
