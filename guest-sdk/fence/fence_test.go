package fence_test

import (
	"errors"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
	"github.com/stagehost/stagehost/guest-sdk/fence"
)

var fenceCalls int

// The test binary is a module with its own fence: it syncs "s0" only.
func init() {
	fence.Register(func() error {
		fenceCalls++
		s, err := stagehost.LookupStream("s0")
		if err != nil {
			return err
		}
		stagehost.Log(stagehost.LevelInfo, "fence: synced s0")
		return s.Sync()
	})
}

func TestRegisteredFenceRunsAfterEveryStage(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("noop")
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		noop, _ := c.Program("noop")
		return s.Submit(noop)
	})
	before := fenceCalls
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
	if fenceCalls != before+1 || e.Pending("s0") != 0 {
		t.Errorf("fence calls %d, pending %d", fenceCalls-before, e.Pending("s0"))
	}
	if err := e.RunFence(); err != nil {
		t.Fatal(err)
	}
}

func TestRegisteredFenceThatMissesAStream(t *testing.T) {
	// Work on s1, which this fence does not sync: the idle check catches it.
	e := emu.New(emu.NewConfig()).Stream("s0").Stream("s1").Programs("noop")
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s1")
		noop, _ := c.Program("noop")
		return s.Submit(noop)
	})
	if _, err := e.Run("main", nil); !errors.Is(err, stagehost.ErrDeviceLost) {
		t.Fatalf("%v", err)
	}
}

func TestRegisteredFenceReportsFailedWork(t *testing.T) {
	// A launch of "fill" without arguments fails on the device. The fence's
	// s.Sync() returns that FAULT: drained, with failed work.
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill")
	e.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		fill, _ := c.Program("fill")
		return s.Submit(fill)
	})
	_, err := e.Run("main", nil)
	var fe *emu.FaultError
	if !errors.As(err, &fe) || !errors.Is(err, stagehost.ErrFault) || errors.Is(err, stagehost.ErrDeviceLost) {
		t.Fatalf("got %v, want a *FaultError", err)
	}
	if !errors.Is(fe.Fence, stagehost.ErrFault) || e.Quarantined() != nil || e.Pending("s0") != 0 {
		t.Errorf("fence %v, quarantined %v, pending %d", fe.Fence, e.Quarantined(), e.Pending("s0"))
	}
	if err := e.RunFence(); err != nil {
		t.Errorf("fence after the failure was reported: %v", err)
	}
}

func TestRegisteredFenceWithoutItsStream(t *testing.T) {
	err := emu.New(emu.NewConfig()).RunFence()
	if !errors.Is(err, stagehost.ErrDeviceLost) || !errors.Is(err, stagehost.ErrNotFound) {
		t.Fatalf("%v", err)
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	fence.Register(func() error { return nil })
}
