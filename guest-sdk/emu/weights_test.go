package emu_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// safetensorsFile is a safetensors file of one F32 tensor "w" of shape
// [2] holding 1.5 and -2.
func safetensorsFile() []byte {
	js := `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	file = append(file, js...)
	return append(file, 0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0)
}

// Weights from a safetensors file: look a tensor up and read it.
func ExampleConfig_WithSafetensors() {
	e := emu.New(emu.NewConfig().WithSafetensors("model", safetensorsFile())).Stream("s0")
	e.Stage("main", func(c *stagehost.Call) error {
		t, err := stagehost.LookupTensor("model/w")
		if err != nil {
			return err
		}
		s, err := c.Stream("s0")
		if err != nil {
			return err
		}
		b := make([]byte, 8)
		if err := s.Read(t.Buf, t.Off, b); err != nil {
			return err
		}
		return c.WriteString(fmt.Sprintf("dtype %d, dims %v, bytes % x", t.Type, t.Dims, b))
	})
	out, err := e.Run("main", nil)
	fmt.Println(string(out), err)
	// Output: dtype 0, dims [2], bytes 00 00 c0 3f 00 00 00 c0 <nil>
}

// TestRawWeightsReadOnly: raw weights are found by name, read, and
// never written or freed, with the host's statuses and last errors.
func TestRawWeightsReadOnly(t *testing.T) {
	e := emu.New(emu.NewConfig().WithWeights("table", []byte("0123456789"))).Stream("s0").Programs("fill")
	e.Stage("main", func(c *stagehost.Call) error {
		w, err := stagehost.LookupWeights("table")
		if err != nil {
			return err
		}
		if n, err := w.Size(); n != 10 || err != nil {
			return fmt.Errorf("size %d, %v", n, err)
		}
		s, _ := c.Stream("s0")
		fill, _ := c.Program("fill")
		var report []string
		for _, write := range []func() error{
			func() error { return s.Write(w, 0, []byte("x")) },
			w.Free,
			func() error { return s.Submit(fill, stagehost.Whole(w), stagehost.F32(1)) },
		} {
			if err := write(); !errors.Is(err, stagehost.ErrInvalidArgument) {
				return fmt.Errorf("want INVALID_ARGUMENT, got %v", err)
			}
			report = append(report, stagehost.LastError())
		}
		if _, err := stagehost.LookupTensor("table/w"); !errors.Is(err, stagehost.ErrNotFound) {
			return fmt.Errorf("a tensor of raw weights: %v", err)
		}
		return c.WriteString(strings.Join(report, "\n"))
	})
	out, err := e.Run("main", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `stream_write: buffer is the read-only weights "table", which cannot be written
buffer_free: buffer is the read-only weights "table", which cannot be freed
fill: argument 0 is the read-only weights "table", but the kernel's argument 0 is written (direction out)`
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	if n := e.Pending("s0"); n != 0 {
		t.Fatalf("%d commands enqueued", n)
	}
}
