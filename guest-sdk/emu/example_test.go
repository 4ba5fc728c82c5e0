package emu_test

import (
	"errors"
	"fmt"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// Declare the session's resources as the operator would, then run the
// stage. Here the stage is given with Stage; a stage package's own tests
// use what its init function registered with stagehost.Main.
func ExampleEmulator_Run() {
	e := emu.New(emu.NewConfig().WithBudget(1<<20)).
		Stream("s0").
		BufferData("greeting", []byte("hello")).
		Programs("copy")

	e.Stage("main", func(c *stagehost.Call) error {
		s, err := c.Stream("s0")
		if err != nil {
			return err
		}
		src, err := c.Buffer("greeting")
		if err != nil {
			return err
		}
		cp, err := c.Program("copy")
		if err != nil {
			return err
		}
		dst, err := c.Alloc(5)
		if err != nil {
			return err
		}
		if err := s.Submit(cp, stagehost.Whole(dst), stagehost.Whole(src)); err != nil {
			return err
		}
		if err := s.Sync(); err != nil {
			return err
		}
		out := make([]byte, 5)
		if err := s.Read(dst, 0, out); err != nil {
			return err
		}
		return c.Write(append(out, c.Input()...))
	})

	out, err := e.Run("main", []byte(", world"))
	fmt.Printf("%s %v\n", out, err)

	// A fence that does not drain quarantines the session.
	e2 := emu.New(emu.NewConfig().WithFence(func() error { return nil })).Stream("s0").Programs("noop")
	e2.Stage("main", func(c *stagehost.Call) error {
		s, _ := c.Stream("s0")
		noop, _ := c.Program("noop")
		return s.Submit(noop) // left running
	})
	_, err = e2.Run("main", nil)
	fmt.Println(errors.Is(err, stagehost.ErrDeviceLost))
	fmt.Println(err)
	// Output:
	// hello, world <nil>
	// true
	// emu: session quarantined: fence could not be proven: stream "s0" still has 1 commands after the fence: stagehost: DEVICE_LOST
}
