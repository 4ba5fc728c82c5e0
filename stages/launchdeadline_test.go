package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// launchInput is the launch module's input (testdata/abi/launch.wat):
// a 1×1×1 grid and block, no shared memory, the given mode, x = 1 2 3 4.
func launchInput(mode uint32) []byte {
	in := make([]byte, 48)
	for i := range 3 {
		binary.LittleEndian.PutUint32(in[4*i:], 1)
		binary.LittleEndian.PutUint32(in[12+4*i:], 1)
	}
	binary.LittleEndian.PutUint32(in[28:], mode)
	copy(in[32:], f32bytes(1, 2, 3, 4))
	return in
}

// TestStreamLaunchLoopStopsAtTheCallsDeadline: a stage launches a vendor
// kernel that loops, with the kernel's default time limit (5 s), in a
// call with a 200 ms deadline, then syncs. The launch carries the call's
// deadline, so the kernel is interrupted there, as the stage is: the
// call gets DeadlineExceeded at about its deadline (not at the kernel's
// 5 s), its error names the kernel's interruption, the fence proves the
// stream drained, the session is not quarantined and its next call runs
// normally (the kernel's failure was reported once, to the call that
// launched it).
func TestStreamLaunchLoopStopsAtTheCallsDeadline(t *testing.T) {
	ctx, s := loopKernelSession(t, loopDeadline)
	start := time.Now()
	_, err := s.Run(ctx, launchInput(0), nil)
	took := time.Since(start)
	t.Logf("call: %v after %s", err, took)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("call: %v, want deadline_exceeded", err)
	}
	if took > loopDeadline+250*time.Millisecond {
		t.Fatalf("the call took %s, want at most its deadline of %s + 250ms: the kernel ran on past the call's deadline", took, loopDeadline)
	}
	if want := `interrupted at its call's deadline`; !strings.Contains(err.Error(), want) {
		t.Fatalf("call: %v, want it to name the kernel's interruption (%q)", err, want)
	}
	if q := s.Quarantined(); q != nil {
		t.Fatalf("quarantined: %v", q)
	}
	// The next call runs normally: its refused launch of a built-in
	// program enqueues nothing, and its sync reports nothing of the
	// earlier call's kernel.
	start = time.Now()
	out, err := s.Run(ctx, launchInput(3), nil)
	if err != nil {
		t.Fatalf("next call: %v", err)
	}
	if len(out) < 8 {
		t.Fatalf("next call: output %d bytes", len(out))
	}
	if st, sync := abi.Status(binary.LittleEndian.Uint32(out)), abi.Status(binary.LittleEndian.Uint32(out[4:])); st != abi.StatusInvalidArgument || sync != abi.StatusOK {
		t.Fatalf("next call: launch %v, sync %v; want INVALID_ARGUMENT, OK", st, sync)
	}
	if took := time.Since(start); took > loopDeadline {
		t.Fatalf("next call took %s", took)
	}
}

// TestSimKernelStopsAtTheCommandsDeadline: a Wasm kernel on a sim stream
// is interrupted at the earlier of its time limit and the deadline its
// command carries (hw.Command.Deadline), and the error says which; a
// command whose deadline passed before it began does not run.
func TestSimKernelStopsAtTheCommandsDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newWasmFixture(t)
	load := func(name string, limit time.Duration) *sim.Program {
		k, err := f.eng.LoadKernel(ctx, kernelFile(t, name), doubleSpec, NewKernelConfig().WithTimeLimit(limit))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Close(ctx) })
		p, err := f.gpu.PrepareKernel(doubleSpec.Info(), k.SimKernel())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	str, err := f.gpu.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer str.Close(ctx)
	x, _ := f.gpu.Alloc(16, hw.AllocHostVisible, nil)
	y, _ := f.gpu.Alloc(16, hw.AllocHostVisible, nil)
	xb, _ := x.HostBytes()
	yb, _ := y.HostBytes()
	copy(xb, f32bytes(1, 2, 3, 4))
	args := []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(4)}
	launch := func(p *sim.Program, deadline time.Time) (time.Duration, error) {
		start := time.Now()
		if _, err := str.Submit(&hw.Command{Program: p, Args: args, Deadline: deadline}); err != nil {
			t.Fatal(err)
		}
		// A kernel past its deadline would run on for an hour: the wait
		// gives up well before.
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := str.Sync(sctx)
		return time.Since(start), err
	}
	wantFault := func(err error, text string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrFault) || !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), text) {
			t.Fatalf("launch: %v, want a fault wrapping deadline_exceeded that says %q", err, text)
		}
	}

	// The call's deadline before the time limit: interrupted there.
	loop := load("loop", time.Hour)
	const d = 100 * time.Millisecond
	took, err := launch(loop, time.Now().Add(d))
	t.Logf("loop, deadline %s: %v after %s", d, err, took)
	wantFault(err, `kernel "double": interrupted at its call's deadline`)
	if took > d+250*time.Millisecond {
		t.Fatalf("the loop ran %s, past its command's deadline of %s", took, d)
	}

	// The time limit before the call's deadline: interrupted at the
	// limit, and the error says so.
	short := load("loop", 100*time.Millisecond)
	_, err = launch(short, time.Now().Add(time.Hour))
	wantFault(err, `kernel "double": interrupted: it ran past its time limit of 100ms`)

	// A deadline that passed before the launch began: the kernel does
	// not run, so y is left as it was.
	double := load("double", time.Hour)
	copy(yb, f32bytes(9, 9, 9, 9))
	_, err = launch(double, time.Now().Add(-time.Millisecond))
	wantFault(err, `kernel "double": interrupted at its call's deadline`)
	if want := f32bytes(9, 9, 9, 9); string(yb) != string(want) {
		t.Fatalf("y = %v after a launch past its deadline, want it untouched (%v)", yb, want)
	}

	// No deadline, and one not yet passed: the kernel runs.
	for _, dl := range []time.Time{{}, time.Now().Add(time.Hour)} {
		clear(yb)
		if _, err := launch(double, dl); err != nil {
			t.Fatalf("deadline %v: %v", dl, err)
		}
		if want := f32bytes(2, 4, 6, 8); string(yb) != string(want) {
			t.Fatalf("deadline %v: y = %v, want %v", dl, yb, want)
		}
	}
}

// TestStreamLaunchLeftToTheFenceStopsAtTheCallsDeadline: a stage
// launches a looping kernel and returns at once, leaving the launch to
// the fence (the built-in drain, 10 s). The kernel is interrupted at the
// call's deadline all the same, so the call fails with Fault (device
// work failed) at about its deadline, not at the kernel's 5 s time
// limit; the fence is proven and the session is not quarantined.
func TestStreamLaunchLeftToTheFenceStopsAtTheCallsDeadline(t *testing.T) {
	ctx, s := loopKernelSession(t, loopDeadline)
	start := time.Now()
	_, err := s.Run(ctx, launchInput(5), nil)
	took := time.Since(start)
	t.Logf("call: %v after %s", err, took)
	if !errors.Is(err, errdefs.ErrFault) || errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("call: %v, want fault (device work failed)", err)
	}
	if want := `interrupted at its call's deadline`; !strings.Contains(err.Error(), want) {
		t.Fatalf("call: %v, want it to name the kernel's interruption (%q)", err, want)
	}
	if took > loopDeadline+250*time.Millisecond {
		t.Fatalf("the call took %s, want at most its deadline of %s + 250ms", took, loopDeadline)
	}
	if q := s.Quarantined(); q != nil {
		t.Fatalf("quarantined: %v", q)
	}
}

// loopKernelSession returns a context of 30 s and a session with the
// looping vendor kernel "loop" as "double", running the launch module
// under deadline d; both end with the test.
//
// loopDeadline is the deadline its tests give it.
func loopKernelSession(t *testing.T, d time.Duration) (context.Context, *Session) {
	t.Helper()
	f := newWasmFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	k, err := f.eng.LoadKernel(ctx, kernelFile(t, "loop"), doubleSpec, NewKernelConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("loop", f.gpu).WithStreams("s0").WithPrograms("double", "fill").
		WithBuffer("x", 16).WithBuffer("y", 16).WithKernels(k).WithDeadline(d)
	s := f.session(t, abiModule(t, f, "launch"), cfg)
	t.Cleanup(func() { s.Close(context.Background()) })
	return ctx, s
}

const loopDeadline = 200 * time.Millisecond
