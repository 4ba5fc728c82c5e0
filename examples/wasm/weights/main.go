// Command weights exercises weights (ABI revision 3) and writes a report
// of what each step returned: the lookups (LookupWeights, LookupTensor),
// what a read-only buffer allows (Size, Stream.Read, an op reading it)
// and what it refuses (Stream.Write, Free, an op writing it), with the
// statuses and the host's last errors. Its tests run it in the emulator
// (main_test.go) and on the host (examples/wasm/host_test.go) with
// tiny.safetensors as the weights "tiny", and compare both reports with
// report.txt: the emulator and the host agree.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o weights.wasm .
package main

import (
	"fmt"
	"strings"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

func init() {
	stagehost.Main(run)
}

func run(c *stagehost.Call) error {
	var r strings.Builder
	step := func(what string, err error, detail string) {
		fmt.Fprintf(&r, "%s: %s", what, stagehost.StatusOf(err))
		if err != nil {
			fmt.Fprintf(&r, " (last error: %s)", stagehost.LastError())
		}
		if detail != "" {
			fmt.Fprintf(&r, " %s", detail)
		}
		r.WriteString("\n")
	}
	s, err := c.Stream("s0")
	if err != nil {
		return err
	}
	w, err := stagehost.LookupWeights("tiny")
	size, _ := w.Size()
	step("weights tiny", err, fmt.Sprintf("size %d", size))
	_, err = stagehost.LookupWeights("none")
	step("weights none", err, "")
	for _, name := range []string{"tiny/w", "tiny/layer.0/bias", "tiny/ids", "tiny/nope", "none/w", "tiny"} {
		t, err := stagehost.LookupTensor(name)
		detail := ""
		if err == nil {
			detail = fmt.Sprintf("same buffer %v, offset %d, dtype %d, dims %v", t.Buf == w, t.Off, t.Type, t.Dims)
		}
		step("tensor "+name, err, detail)
	}
	got := make([]byte, 8)
	err = s.Read(w, 16, got)
	step("read", err, fmt.Sprintf("% x", got))
	err = s.Write(w, 0, []byte("overwrite"))
	step("write", err, "")
	err = w.Free()
	step("free", err, "")
	cp, err := c.Program("copy")
	if err != nil {
		return err
	}
	b, err := c.Alloc(8)
	if err != nil {
		return err
	}
	err = s.Submit(cp, stagehost.Buf(w, 0, 8), stagehost.Buf(b, 0, 8))
	step("copy into the weights", err, "")
	err = s.Submit(cp, stagehost.Buf(b, 0, 8), stagehost.Buf(w, 0, 8))
	if err == nil {
		err = s.Sync()
	}
	if err == nil {
		err = s.Read(b, 0, got)
	}
	step("copy from the weights", err, fmt.Sprintf("% x", got))
	err = s.Read(w, 0, got)
	step("read again", err, fmt.Sprintf("% x", got))
	return c.WriteString(r.String())
}

// main is never called: a c-shared Wasm module runs init functions from
// _initialize, and the host calls stagehost_run.
func main() {}
