package emu

import (
	"bytes"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// TestLastErrorOutParameterRule: last_error into a destination too small
// gives the length and OUT_OF_BOUNDS and writes nothing; its own failure
// leaves the last error as it was; the SDK's LastError grows its buffer
// for a message longer than its first guess; a message is cut at
// maxErrorMessage bytes.
func TestLastErrorOutParameterRule(t *testing.T) {
	e := New(NewConfig())
	long := strings.Repeat("n", 300)
	_, err := e.Stage("main", func(c *stagehost.Call) error {
		if _, err := c.Program(long); err == nil {
			t.Error("program_get of an unknown name succeeded")
		}
		h := (*abiHost)(e)
		want := `program "` + long + `" not found: the session may use no program of that name`
		small := bytes.Repeat([]byte{0xBB}, 8)
		n, st := h.LastError(small)
		if st != outOfBounds || n != uint32(len(want)) || !bytes.Equal(small, bytes.Repeat([]byte{0xBB}, 8)) {
			t.Errorf("last_error into 8 bytes: %d, status %d, bytes % x; want %d, OUT_OF_BOUNDS, untouched", n, st, small, len(want))
		}
		if got := stagehost.LastError(); got != want {
			t.Errorf("LastError = %q, want %q", got, want)
		}
		return nil
	}).Run("main", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cutMessage(strings.Repeat("é", maxErrorMessage)); len(got) != maxErrorMessage {
		t.Errorf("a message of %d bytes was cut to %d, want %d", 2*maxErrorMessage, len(got), maxErrorMessage)
	}
	if got := cutMessage("x" + strings.Repeat("é", maxErrorMessage)); len(got) != maxErrorMessage-1 {
		t.Errorf("a message cut inside a character has %d bytes, want %d", len(got), maxErrorMessage-1)
	}
}
