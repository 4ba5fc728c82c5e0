// Command minimal is the smallest useful stagehost stage: it writes "ok:"
// followed by its input with the bytes in reverse order. It does no device
// work.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o minimal.wasm .
package main

import stagehost "github.com/stagehost/stagehost/guest-sdk"

func init() {
	stagehost.Main(run)
}

func run(c *stagehost.Call) error {
	in := c.Input()
	out := make([]byte, 3+len(in))
	copy(out, "ok:")
	for i, b := range in {
		out[len(out)-1-i] = b
	}
	return c.Write(out)
}

// main is never called: a c-shared Wasm module runs init functions from
// _initialize, and the host calls stagehost_run.
func main() {}
