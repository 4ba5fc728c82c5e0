package emu_test

import (
	"errors"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// Device failures and fences (ABI.md §4.1, §4.4). A launch of "fill" with
// no arguments is accepted by stream_submit and fails on the device when it
// retires.

// submitBad enqueues n launches on the stream name that fail on the device.
func submitBad(t *testing.T, c *stagehost.Call, name string, n int) stagehost.Stream {
	t.Helper()
	s := must[stagehost.Stream](t)(c.Stream(name))
	fill := must[stagehost.Program](t)(c.Program("fill"))
	for range n {
		if err := s.Submit(fill); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// syncS0 is a fence that returns what s0's Sync returns, like package
// fence's example.
func syncS0() error {
	s, err := stagehost.LookupStream("s0")
	if err != nil {
		return err
	}
	return s.Sync()
}

// wantFault checks that err is a *FaultError naming every string of names,
// with the session healthy and drained.
func wantFault(t *testing.T, e *emu.Emulator, err error, failures int, names ...string) *emu.FaultError {
	t.Helper()
	var fe *emu.FaultError
	var q *emu.QuarantineError
	if !errors.As(err, &fe) || !errors.Is(err, stagehost.ErrFault) || errors.As(err, &q) || errors.Is(err, stagehost.ErrDeviceLost) {
		t.Fatalf("got %v, want a *FaultError and no quarantine", err)
	}
	if e.Quarantined() != nil {
		t.Fatalf("quarantined: %v", e.Quarantined())
	}
	if len(fe.Failures) != failures {
		t.Errorf("%d failures recorded, want %d: %v", len(fe.Failures), failures, fe)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%v does not name %q", err, n)
		}
	}
	return fe
}

func TestUnsyncedFailureUnderBuiltinFence(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Stream("s1").Programs("fill", "noop")
	e.Stage("main", func(c *stagehost.Call) error {
		submitBad(t, c, "s0", 2)
		submitBad(t, c, "s1", 1)
		return c.WriteString("looks fine")
	})
	out, err := e.Run("main", nil)
	if out != nil {
		t.Errorf("output of a failed run: %q", out)
	}
	// The built-in fence drained both streams and recorded every failure.
	fe := wantFault(t, e, err, 3, `stream "s0": command 1`, `stream "s0": command 2`, `stream "s1": command 1`)
	if fe.Fence != nil || e.Pending("s0")+e.Pending("s1") != 0 {
		t.Errorf("fence %v, pending %d", fe.Fence, e.Pending("s0")+e.Pending("s1"))
	}
	// The failures were this run's: the next one succeeds.
	e.Stage("main", func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		return errors.Join(s.Submit(must[stagehost.Program](t)(c.Program("noop"))), c.WriteString("ok"))
	})
	if out, err := e.Run("main", nil); err != nil || string(out) != "ok" {
		t.Errorf("next run: %q %v", out, err)
	}
	if err := e.RunFence(); err != nil {
		t.Errorf("fence alone: %v", err)
	}
}

func TestFenceReturningSyncFault(t *testing.T) {
	for name, c := range map[string]struct {
		fence func() error
		fault bool // FaultError.Fence is set
	}{
		// The example fence of package fence: Sync's FAULT means drained,
		// with failed work.
		"returns s.Sync()": {syncS0, true},
		// A fence that sees the FAULT and drops it: the host recorded it.
		"ignores the FAULT": {func() error { _ = syncS0(); return nil }, false},
		// The failure named only by the fence's status.
		"returns ErrFault": {func() error { _ = syncS0(); return stagehost.ErrFault }, true},
	} {
		t.Run(name, func(t *testing.T) {
			e := emu.New(emu.NewConfig().WithFence(c.fence)).Stream("s0").Programs("fill")
			e.Stage("main", func(c *stagehost.Call) error {
				submitBad(t, c, "s0", 1)
				return nil
			})
			_, err := e.Run("main", nil)
			fe := wantFault(t, e, err, 1, `stream "s0": command 1`)
			if (fe.Fence != nil) != c.fault || (c.fault && !errors.Is(fe.Fence, stagehost.ErrFault)) {
				t.Errorf("fence error %v", fe.Fence)
			}
			// Not quarantined: the session runs again.
			if _, err := e.Run("main", nil); !errors.As(err, &fe) {
				t.Errorf("second run: %v", err)
			}
		})
	}
}

func TestFenceFailuresOtherThanFaultQuarantine(t *testing.T) {
	// Each fence drains s0 first, so the idle check passes: only the
	// fence's result can quarantine.
	drained := func(err error) func() error {
		return func() error { _ = syncS0(); return err }
	}
	for name, c := range map[string]struct {
		fence func() error
		want  string
	}{
		"plain error":    {drained(errors.New("cannot prove it")), "cannot prove it"},
		"NOT_FOUND":      {drained(&stagehost.Error{Op: "stream_get", Status: stagehost.StatusNotFound}), "NOT_FOUND"},
		"DEVICE_LOST":    {drained(stagehost.ErrDeviceLost), "DEVICE_LOST"},
		"panics a FAULT": {func() error { _ = syncS0(); panic(stagehost.ErrFault) }, "fence trapped"},
		"FAULT, busy":    {func() error { return stagehost.ErrFault }, `stream "s0" still has 1 commands after the fence`},
	} {
		t.Run(name, func(t *testing.T) {
			e := emu.New(emu.NewConfig().WithFence(c.fence)).Stream("s0").Programs("fill")
			e.Stage("main", func(c *stagehost.Call) error {
				submitBad(t, c, "s0", 1)
				return nil
			})
			_, err := e.Run("main", nil)
			var q *emu.QuarantineError
			if !errors.As(err, &q) || !errors.Is(err, stagehost.ErrDeviceLost) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a quarantine naming %q", err, c.want)
			}
			if e.Quarantined() != q {
				t.Errorf("quarantined: %v", e.Quarantined())
			}
			// A failure the fence's Sync reported is named, not unwrapped.
			if q.Failed != nil && !strings.Contains(err.Error(), "device work had failed") {
				t.Errorf("failure not named: %v", err)
			}
		})
	}
}

func TestStageIgnoresSyncFault(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill")
	e.Stage("main", func(c *stagehost.Call) error {
		s := submitBad(t, c, "s0", 1)
		if err := s.Sync(); !errors.Is(err, stagehost.ErrFault) {
			t.Fatalf("sync: %v", err)
		}
		// The stage drops the FAULT and claims success.
		return c.WriteString("all good")
	})
	out, err := e.Run("main", nil)
	if out != nil {
		t.Errorf("output of a failed run: %q", out)
	}
	// Sync reported the failure, so the built-in fence found nothing more.
	wantFault(t, e, err, 1, "takes 2 arguments")
}

func TestClientErrorNamesFailedWork(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill")
	e.Stage("main", func(c *stagehost.Call) error {
		s := submitBad(t, c, "s0", 1)
		_ = s.Sync()
		return &stagehost.Error{Op: "decode", Status: stagehost.StatusNotFound}
	})
	_, err := e.Run("main", nil)
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusNotFound) || ce.Message != "stagehost: decode: NOT_FOUND" {
		t.Fatalf("got %#v, want the stage's client error", err)
	}
	if ce.Failed == nil || !errors.Is(err, stagehost.ErrFault) || !strings.Contains(err.Error(), "takes 2 arguments") {
		t.Errorf("the failure is not named: %v", err)
	}
	if e.Quarantined() != nil {
		t.Errorf("quarantined: %v", e.Quarantined())
	}
	// A client error without failed work does not match ErrFault.
	e.Stage("main", func(*stagehost.Call) error { return errors.New("no") })
	if _, err := e.Run("main", nil); !errors.As(err, &ce) || ce.Failed != nil || errors.Is(err, stagehost.ErrFault) {
		t.Errorf("plain client error: %v", err)
	}
}

func TestTrapNamesFailedWork(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill")
	e.Stage("main", func(c *stagehost.Call) error {
		submitBad(t, c, "s0", 1)
		panic("boom")
	})
	_, err := e.Run("main", nil)
	var te *emu.TrapError
	if !errors.As(err, &te) || te.Failed == nil || !strings.Contains(err.Error(), "takes 2 arguments") || e.Quarantined() != nil {
		t.Fatalf("%v", err)
	}
}
