package main

import (
	"errors"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// leave is a stage that leaves work on s0: n launches of prog with args.
func leave(n int, prog string, args ...stagehost.Arg) func(*stagehost.Call) error {
	return func(c *stagehost.Call) error {
		s, err := c.Stream("s0")
		if err != nil {
			return err
		}
		p, err := c.Program(prog)
		if err != nil {
			return err
		}
		for range n {
			if err := s.Submit(p, args...); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestFenceDrains(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("noop").Stage("main", leave(5, "noop"))
	for range 3 {
		if _, err := e.Run("main", nil); err != nil {
			t.Fatal(err)
		}
	}
	if e.Pending("s0") != 0 {
		t.Error("work left")
	}
	logs := e.Logs()
	if len(logs) != 3 || logs[0].Message != "fence: s0 drained" {
		t.Errorf("%v", logs)
	}
}

func TestFenceToleratesFailedLaunch(t *testing.T) {
	// fill with no arguments fails on the device; the stream still
	// drains, so the session is not quarantined, but the call fails with
	// Fault (ABI.md §4.4): failed device work never reaches the caller as
	// success.
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill").Stage("main", leave(1, "fill"))
	if _, err := e.Run("main", nil); !errors.Is(err, stagehost.ErrFault) {
		t.Fatalf("Run = %v, want an error matching ErrFault", err)
	}
	if e.Quarantined() != nil {
		t.Fatal("quarantined")
	}
	var warned bool
	for _, l := range e.Logs() {
		warned = warned || (l.Level == stagehost.LevelWarn && strings.Contains(l.Message, "FAULT"))
	}
	if !warned {
		t.Errorf("no warning: %v", e.Logs())
	}
}

func TestFenceWithoutStreamFails(t *testing.T) {
	err := emu.New(emu.NewConfig()).Stream("other").RunFence()
	if !errors.Is(err, stagehost.ErrDeviceLost) || !errors.Is(err, stagehost.ErrNotFound) {
		t.Fatalf("%v", err)
	}
}

func TestFenceMissesOtherStreams(t *testing.T) {
	// The fence drains s0 only; work on s1 fails the host's idle check.
	e := emu.New(emu.NewConfig()).Stream("s0").Stream("s1").Programs("noop")
	e.Stage("main", func(c *stagehost.Call) error {
		s1, _ := c.Stream("s1")
		noop, _ := c.Program("noop")
		return s1.Submit(noop)
	})
	if _, err := e.Run("main", nil); !errors.Is(err, stagehost.ErrDeviceLost) {
		t.Fatalf("%v", err)
	}
}
