package emu_test

import (
	"errors"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// saxpyReason is saxpy's refusal of an x and a y of different lengths, in
// hw/sim's words.
const saxpyReason = "saxpy: x has 4 values, y 2"

// TestWrongSaxpyGivesTheKernelsReason: a saxpy whose x has 4 values and y
// 2 fails on the device; Sync's error, LastError and the run's error carry
// the kernel's reason, naming the command and the program, as the host's
// do (stages' TestLastErrorGivesTheKernelsReason).
func TestWrongSaxpyGivesTheKernelsReason(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("x", 16).Buffer("y", 8).Programs("saxpy")
	var syncErr error
	var last string
	e.Stage("main", func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		p := must[stagehost.Program](t)(c.Program("saxpy"))
		x := must[stagehost.Buffer](t)(c.Buffer("x"))
		y := must[stagehost.Buffer](t)(c.Buffer("y"))
		if err := s.Submit(p, stagehost.F32(2), stagehost.Whole(x), stagehost.Whole(y)); err != nil {
			return err
		}
		syncErr = s.Sync()
		last = stagehost.LastError()
		return nil
	})
	_, err := e.Run("main", nil)
	wantFault(t, e, err, 1, saxpyReason)
	var se *stagehost.Error
	if !errors.As(syncErr, &se) || !errors.Is(syncErr, stagehost.ErrFault) {
		t.Fatalf("Sync = %v, want a FAULT *stagehost.Error", syncErr)
	}
	if want := "stagehost: stream_sync: FAULT: "; !strings.HasPrefix(syncErr.Error(), want) {
		t.Errorf("Sync = %q, want it to start %q", syncErr, want)
	}
	for _, want := range []string{`kernel "saxpy": ` + saxpyReason, "command 1"} {
		if !strings.Contains(se.Reason, want) {
			t.Errorf("Sync's reason %q lacks %q", se.Reason, want)
		}
	}
	if last != se.Reason {
		t.Errorf("LastError after the Sync = %q, want Sync's reason %q", last, se.Reason)
	}
	if !errors.Is(syncErr, &stagehost.Error{Op: "stream_sync", Status: stagehost.StatusFault}) {
		t.Errorf("%v does not match its Op and Status: a reason must not stop errors.Is", syncErr)
	}
}

// TestLookupErrorsNameWhatWasNotFound: the SDK's error of a lookup names
// the name, and the last error does too.
func TestLookupErrorsNameWhatWasNotFound(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("saxpy")
	run(t, e, func(c *stagehost.Call) error {
		for _, tc := range []struct {
			err  error
			want string
		}{
			{func() error { _, err := c.Program("saxpi"); return err }(), `stagehost: program_get "saxpi": NOT_FOUND`},
			{func() error { _, err := c.Stream("s1"); return err }(), `stagehost: stream_get "s1": NOT_FOUND`},
			{func() error { _, err := c.Buffer("w"); return err }(), `stagehost: buffer_get "w": NOT_FOUND`},
		} {
			if tc.err == nil || tc.err.Error() != tc.want || !errors.Is(tc.err, stagehost.ErrNotFound) {
				t.Errorf("got %v, want %s", tc.err, tc.want)
			}
		}
		if got, want := stagehost.LastError(), `buffer "w" not found: the session declares no buffer of that name`; got != want {
			t.Errorf("LastError = %q, want %q", got, want)
		}
		return nil
	})
}

// TestLastErrorIsPerRun: a run starts with no last error; an OK status
// does not clear it.
func TestLastErrorIsPerRun(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0")
	run(t, e, func(c *stagehost.Call) error {
		if _, err := c.Program("nope"); err == nil {
			t.Error("program_get(nope) succeeded")
		}
		if _, err := c.Stream("s0"); err != nil {
			t.Fatal(err)
		}
		if got := stagehost.LastError(); !strings.Contains(got, `program "nope" not found`) {
			t.Errorf("LastError after an OK call = %q, want the NOT_FOUND's", got)
		}
		return nil
	})
	run(t, e, func(c *stagehost.Call) error {
		if got := stagehost.LastError(); got != "" {
			t.Errorf("LastError at the start of a run = %q, want none", got)
		}
		return nil
	})
}
