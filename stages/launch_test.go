package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw/sim"
)

// TestStreamLaunch runs stream_launch (ABI revision 4) from a stage:
// each row's shape and mode give exactly its status, and a refused
// launch enqueues nothing and names what is wrong in the last error.
func TestStreamLaunch(t *testing.T) {
	f := newWasmFixture(t)
	ctx := context.Background()
	k, err := f.eng.LoadKernel(ctx, kernelFile(t, "double"), doubleSpec, NewKernelConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("launch", f.gpu).WithStreams("s0").WithPrograms("double", "fill").
		WithBuffer("x", 16).WithBuffer("y", 16).WithKernels(k)
	s := f.session(t, abiModule(t, f, "launch"), cfg)
	defer s.Close(ctx)
	str := s.Owner().Streams()[0].(*sim.Stream)
	for _, row := range []struct {
		name        string
		grid, block [3]uint32
		shared      uint32
		mode        uint32
		status      abi.Status
		lastError   string
	}{
		{"ok", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 0, abi.StatusOK, ""},
		{"max shape", [3]uint32{1<<31 - 1, 65535, 65535}, [3]uint32{1024, 1, 1}, 48 << 10, 0, abi.StatusOK, ""},
		{"stream_submit", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 1, abi.StatusInvalidArgument,
			`program "double" is a vendor kernel: launch it with stream_launch`},
		{"block.x over", [3]uint32{1, 1, 1}, [3]uint32{1025, 1, 1}, 0, 0, abi.StatusInvalidArgument,
			`kernel "double": launch shape: block.x = 1025, over the device's limit of 1024`},
		{"block.z over", [3]uint32{1, 1, 1}, [3]uint32{1, 1, 65}, 0, 0, abi.StatusInvalidArgument,
			`block.z = 65, over the device's limit of 64`},
		{"threads over", [3]uint32{1, 1, 1}, [3]uint32{64, 32, 1}, 0, 0, abi.StatusInvalidArgument,
			`block [64 32 1] is 2048 threads, over the device's limit of 1024 per block`},
		{"grid.y over", [3]uint32{1, 65536, 1}, [3]uint32{1, 1, 1}, 0, 0, abi.StatusInvalidArgument,
			`grid.y = 65536, over the device's limit of 65535`},
		{"zero dim", [3]uint32{0, 1, 1}, [3]uint32{1, 1, 1}, 0, 0, abi.StatusInvalidArgument,
			`every dimension is at least 1`},
		{"shared over", [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 48<<10 + 1, 0, abi.StatusInvalidArgument,
			`49153 bytes of shared memory, over the device's limit of 49152`},
		{"too few args", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 2, abi.StatusInvalidArgument,
			`kernel "double" takes 3 arguments, got 2`},
		{"built in", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 3, abi.StatusInvalidArgument,
			`program "fill" is built in: stream_launch launches vendor kernels; use stream_submit`},
		{"scalar for buffer", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 4, abi.StatusInvalidArgument,
			`kernel "double": argument 1 (y) is a buffer (f32, out), got a scalar`},
		// The pointers (ABI.md §3.5's order): grid and block are read
		// before the program's kind and the shape, the records after the
		// shape and their count.
		{"built in, grid out of bounds", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 6, abi.StatusOutOfBounds,
			`pointer or length outside guest memory`},
		{"block out of bounds", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 7, abi.StatusOutOfBounds,
			`pointer or length outside guest memory`},
		{"block out of bounds, bad shape", [3]uint32{0, 1, 1}, [3]uint32{4, 1, 1}, 0, 7, abi.StatusOutOfBounds,
			`pointer or length outside guest memory`},
		{"records out of bounds", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 8, abi.StatusOutOfBounds,
			`pointer or length outside guest memory`},
		{"records out of bounds, bad shape", [3]uint32{1, 1, 1}, [3]uint32{1025, 1, 1}, 0, 8, abi.StatusInvalidArgument,
			`block.x = 1025, over the device's limit of 1024`},
		{"17 records out of bounds", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 9, abi.StatusInvalidArgument,
			`17 arguments, at most 16`},
		{"range past the buffer", [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, 10, abi.StatusInvalidArgument,
			`argument 1: range [4,+16) outside a buffer of 16 bytes`},
	} {
		t.Run(row.name, func(t *testing.T) {
			in := make([]byte, 48)
			for i := range 3 {
				binary.LittleEndian.PutUint32(in[4*i:], row.grid[i])
				binary.LittleEndian.PutUint32(in[12+4*i:], row.block[i])
			}
			binary.LittleEndian.PutUint32(in[24:], row.shared)
			binary.LittleEndian.PutUint32(in[28:], row.mode)
			copy(in[32:], f32bytes(1, 2, 3, 4))
			before := str.Submitted()
			out, err := s.Run(ctx, in, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) < 32 {
				t.Fatalf("output %d bytes", len(out))
			}
			st, sync := abi.Status(binary.LittleEndian.Uint32(out)), abi.Status(binary.LittleEndian.Uint32(out[4:]))
			msg := string(out[32:])
			if st != row.status || sync != abi.StatusOK {
				t.Fatalf("launch %v, sync %v; want %v, OK (last error %q)", st, sync, row.status, msg)
			}
			launched := str.Submitted() - before - 2 // less the stage's stream_write and stream_read
			if row.status != abi.StatusOK {
				if launched != 0 {
					t.Fatalf("a refused launch enqueued %d commands", launched)
				}
				if !strings.Contains(msg, row.lastError) {
					t.Fatalf("last error %q, want it to contain %q", msg, row.lastError)
				}
				return
			}
			if launched != 1 {
				t.Fatalf("%d commands enqueued, want 1", launched)
			}
			if got, want := string(out[8:24]), string(f32bytes(2, 4, 6, 8)); got != want {
				t.Fatalf("y = %x, want %x", got, want)
			}
		})
	}
}

// TestStreamLaunchLoopPastDeadline: a vendor kernel that loops past the
// stage call's deadline: the call fails with DeadlineExceeded; the
// kernel is stopped at the call's deadline (before its own time limit),
// so the fence proves the stream drained within its timeout and the
// session is not quarantined.
func TestStreamLaunchLoopPastDeadline(t *testing.T) {
	f := newWasmFixture(t)
	ctx := context.Background()
	k, err := f.eng.LoadKernel(ctx, kernelFile(t, "loop"), doubleSpec, NewKernelConfig().WithTimeLimit(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewSessionConfig("loop", f.gpu).WithStreams("s0").WithPrograms("double", "fill").
		WithBuffer("x", 16).WithBuffer("y", 16).WithKernels(k).
		WithDeadline(100 * time.Millisecond).WithFenceTimeout(2 * time.Second)
	s := f.session(t, abiModule(t, f, "launch"), cfg)
	defer s.Close(ctx)
	in := make([]byte, 48)
	for i := range 3 {
		binary.LittleEndian.PutUint32(in[4*i:], 1)
		binary.LittleEndian.PutUint32(in[12+4*i:], 1)
	}
	start := time.Now()
	_, err = s.Run(ctx, in, nil)
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("call: %v, want deadline_exceeded", err)
	}
	t.Logf("call: %v after %s", err, time.Since(start))
	if q := s.Quarantined(); q != nil {
		t.Fatalf("quarantined: %v", q)
	}
	// The next call runs: the looping launch failed (FAULT, reported
	// once, at this call's sync) and the new one too.
	if _, err := s.Run(ctx, in, nil); err != nil && !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("second call: %v", err)
	}
}
