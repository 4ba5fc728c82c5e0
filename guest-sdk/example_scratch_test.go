package stagehost_test

import (
	"fmt"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// roundTrip uploads its input to a device buffer and returns the buffer's
// bytes, with no allocation per call once the SDK's buffers have grown:
// the input is read into the SDK's reused buffer (InputView, valid until
// the stage returns) and the result downloaded through another
// (WriteFrom).
func roundTrip(c *stagehost.Call) error {
	in, err := c.InputView()
	if err != nil {
		return err
	}
	s, err := c.Stream("s0")
	if err != nil {
		return err
	}
	b, err := c.AllocNamed("roundtrip", 64)
	if err != nil {
		return err
	}
	if len(in) > 64 {
		return fmt.Errorf("at most 64 bytes: %w", stagehost.ErrInvalidArgument)
	}
	if err := s.Write(b, 0, in); err != nil {
		return err
	}
	return c.WriteFrom(s, b, 0, len(in))
}

func ExampleCall_InputView() {
	e := emu.New(emu.NewConfig()).Stream("s0").Stage("main", roundTrip)
	for _, in := range []string{"first call", "second"} {
		out, err := e.Run("main", []byte(in))
		fmt.Printf("%q %v\n", out, err)
	}
	// Output:
	// "first call" <nil>
	// "second" <nil>
}
