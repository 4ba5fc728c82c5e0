package emu_test

import (
	"bytes"
	"errors"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// InputView gives the call's input; a later call's view reuses the same
// storage (the SDK's buffer: a steady stage allocates nothing for it), so
// a stage must not keep it; after
// ReadInput it is ReadInput's own slice.
func TestInputView(t *testing.T) {
	e := emu.New(emu.NewConfig())
	var views [][]byte
	e.Stage("main", func(c *stagehost.Call) error {
		v, err := c.InputView()
		if err != nil {
			return err
		}
		if again, _ := c.InputView(); &again[0] != &v[0] {
			t.Error("a second InputView in the same call read the input again")
		}
		views = append(views, v)
		return c.Write(v)
	})
	e.Stage("owned", func(c *stagehost.Call) error {
		in, err := c.ReadInput()
		if err != nil {
			return err
		}
		if v, _ := c.InputView(); &v[0] != &in[0] {
			t.Error("InputView after ReadInput is not ReadInput's slice")
		}
		return nil
	})
	for i, in := range [][]byte{[]byte("first input"), []byte("second")} {
		out, err := e.Run("main", in)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("call %d: the view held %q, not the input %q", i, out, in)
		}
	}
	if !raceEnabled && &views[0][0] != &views[1][0] { // the race detector makes sync.Pool drop items
		t.Error("the second call's view is not in the first call's storage")
	}
	if _, err := e.Run("owned", []byte("x")); err != nil {
		t.Fatal(err)
	}
}

// WriteFrom appends a device buffer's bytes to the output (after what the
// stage wrote before), downloading them through the SDK's buffer; a failed
// download appends nothing.
func TestWriteFrom(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").BufferData("b", []byte("0123456789"))
	out, err := e.Stage("main", func(c *stagehost.Call) error {
		s, err := c.Stream("s0")
		if err != nil {
			return err
		}
		b, err := c.Buffer("b")
		if err != nil {
			return err
		}
		if err := c.WriteString("<"); err != nil {
			return err
		}
		if err := c.WriteFrom(s, b, 2, 5); err != nil {
			return err
		}
		if err := c.WriteFrom(s, b, 8, 5); !errors.Is(err, stagehost.ErrInvalidArgument) {
			t.Errorf("a range past the buffer's end: %v", err)
		}
		if err := c.WriteFrom(s, b, 0, -1); !errors.Is(err, stagehost.ErrInvalidArgument) {
			t.Errorf("a negative length: %v", err)
		}
		return c.WriteString(">")
	}).Run("main", nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "<23456>" {
		t.Fatalf("output %q, want %q", out, "<23456>")
	}
}
