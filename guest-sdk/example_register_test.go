package stagehost_test

import (
	"fmt"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// One module can serve several entry points; the caller names one.
func init() {
	stagehost.Register("reverse", func(c *stagehost.Call) error {
		in := c.Input()
		out := make([]byte, len(in))
		for i, b := range in {
			out[len(in)-1-i] = b
		}
		return c.Write(out)
	})
	stagehost.Register("entry", func(c *stagehost.Call) error {
		return c.WriteString(c.Entry())
	})
}

func ExampleRegister() {
	e := emu.New(emu.NewConfig())
	out, _ := e.Run("reverse", []byte("stage"))
	fmt.Println(string(out))
	out, _ = e.Run("entry", nil)
	fmt.Println(string(out))
	_, err := e.Run("nope", nil)
	fmt.Println(err)
	// Output:
	// egats
	// entry
	// emu: stage failed with code 5: stagehost: no stage registered for entry "nope"
}
