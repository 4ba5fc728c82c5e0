package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// doubleSpec is the declaration every kernel of testdata/kernels is
// checked against: double(x f32 in, y f32 out, n u32).
var doubleSpec = KernelSpec{Name: "double", Entry: "double", Args: []hw.KernelArg{
	hw.KernelBuffer("x", "f32", "in", ""),
	hw.KernelBuffer("y", "f32", "out", ""),
	hw.KernelScalar("n", "u32"),
}}

func kernelFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "kernels", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// TestKernelCorpus runs the hostile kernel corpus: each row's module is
// validated, loaded and launched through a sim device's stream, and the
// outcome (refused at load, or the launch's error at Sync) must be
// exactly the row's.
func TestKernelCorpus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	p := sim.New()
	defer p.Close()
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewKernelConfig().WithTimeLimit(200 * time.Millisecond).WithMemoryLimit(1 << 20)
	for _, row := range []struct {
		file string
		// load: the load error's class and text; empty when it loads.
		loadClass error
		load      string
		// run: the launch's error classes and text; none when it succeeds.
		runClasses []error
		run        string
		// memory: the kernel's memory limit, when not cfg's.
		memory int64
	}{
		{file: "double"},
		{file: "double_c"}, // built from C, docs/guest.md
		{file: "loop", runClasses: []error{errdefs.ErrFault, errdefs.ErrDeadlineExceeded}, run: `kernel "double": interrupted: it ran past its time limit of 200ms`},
		{file: "fill_loop", runClasses: []error{errdefs.ErrFault, errdefs.ErrDeadlineExceeded}, run: `kernel "double": interrupted: it ran past its time limit of 200ms`, memory: 64 << 20},
		{file: "trap", runClasses: []error{errdefs.ErrFault}, run: `kernel "double": failed: wasm error: unreachable`},
		{file: "oob", runClasses: []error{errdefs.ErrFault}, run: `kernel "double": failed: wasm error: out of bounds memory access`},
		{file: "hugemem", runClasses: []error{errdefs.ErrFault}, run: `kernel "double": failed: wasm error: out of bounds memory access`},
		{file: "wrongsig", loadClass: errdefs.ErrInvalidArgument, load: `kernel "double": export "double" is (i32) -> (), want (i32, i32, i32, i32, i32) -> ()`},
		{file: "noexport", loadClass: errdefs.ErrInvalidArgument, load: `kernel "double": exports no function "double"`},
		{file: "imports", loadClass: errdefs.ErrInvalidArgument, load: `kernel "double": imports stagehost_v1.stream_sync: a vendor kernel imports nothing`},
		{file: "nomemory", loadClass: errdefs.ErrInvalidArgument, load: `kernel "double": exports no memory named "memory"`},
		// The start function is the module's function 0; the instrumented
		// module's is function 1, which the error must not name.
		{file: "starttrap", runClasses: []error{errdefs.ErrFault}, run: `kernel "double": does not instantiate: start function[0] failed: wasm error: unreachable`},
	} {
		t.Run(row.file, func(t *testing.T) {
			bin := kernelFile(t, row.file)
			cfg := cfg
			if row.memory != 0 {
				cfg = cfg.WithMemoryLimit(row.memory)
			}
			verr := ValidateKernel(bin, doubleSpec, cfg)
			k, err := eng.LoadKernel(ctx, bin, doubleSpec, cfg)
			if row.load != "" {
				for _, e := range []error{verr, err} {
					if e == nil || !errors.Is(e, row.loadClass) || !strings.Contains(e.Error(), row.load) {
						t.Fatalf("load: got %v, want %v containing %q", e, row.loadClass, row.load)
					}
				}
				return
			}
			if verr != nil || err != nil {
				t.Fatalf("load: %v / %v", verr, err)
			}
			defer k.Close(ctx)
			prog, err := dev.PrepareKernel(doubleSpec.Info(), k.SimKernel())
			if err != nil {
				t.Fatal(err)
			}
			str, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer str.Close(ctx)
			x, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
			y, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
			xb, _ := x.HostBytes()
			copy(xb, f32bytes(1, 2, 3, 4))
			if _, err := str.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(4)}}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = str.Sync(ctx)
			// An interrupted kernel ends near its 200 ms time limit,
			// whatever its instructions are (a loop of 1 MiB fills,
			// charged one instruction a fill, would run for seconds).
			if d := time.Since(start); errors.Is(err, errdefs.ErrDeadlineExceeded) && d > 2*time.Second {
				t.Fatalf("interrupted after %v; the time limit is 200ms", d)
			}
			if row.run == "" {
				if err != nil {
					t.Fatal(err)
				}
				yb, _ := y.HostBytes()
				if want := f32bytes(2, 4, 6, 8); string(yb) != string(want) {
					t.Fatalf("y = %v, want %v", yb, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), row.run) {
				t.Fatalf("launch: got %v, want an error containing %q", err, row.run)
			}
			for _, c := range row.runClasses {
				if !errors.Is(err, c) {
					t.Fatalf("launch: %v is not %v", err, c)
				}
			}
			// The stream and the device survive a hostile kernel.
			if err := dev.Err(); err != nil {
				t.Fatalf("device: %v", err)
			}
		})
	}
}

// TestValidateKernelIsTheLoadsCheck: ValidateKernel (what `stagehost
// check` runs) refuses exactly what LoadKernel refuses, with the same
// error, for the same memory limit: a memory minimum over the limit, a
// body that does not validate on the operand stack. A maximum over the
// limit is capped, not refused.
func TestValidateKernelIsTheLoadsCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	for _, row := range []struct {
		file string
		cfg  KernelConfig
		want string // "": accepted
	}{
		{"minmem", NewKernelConfig(), `kernel "double": its memory's minimum is 8192 pages (512 MiB), over the kernel memory limit of 4096 pages (256 MiB): it could never be instantiated`},
		{"double", NewKernelConfig().WithMemoryLimit(0), ""}, // a minimum of 1 page, the limit's least
		{"minmem", NewKernelConfig().WithMemoryLimit(512 << 20), ""},
		{"minmem", NewKernelConfig().WithMemoryLimit(8191 << 16), `its memory's minimum is 8192 pages (512 MiB), over the kernel memory limit of 8191 pages (524224 KiB)`},
		{"bigmax", NewKernelConfig(), ""},
		{"badtype", NewKernelConfig(), `kernel "double": does not compile: invalid function[0] export["double"]: cannot pop the 1st operand for i32.add: type mismatch: expected i32, but was f32`},
	} {
		bin := kernelFile(t, row.file)
		verr := ValidateKernel(bin, doubleSpec, row.cfg)
		k, lerr := eng.LoadKernel(ctx, bin, doubleSpec, row.cfg)
		if row.want == "" {
			if verr != nil || lerr != nil {
				t.Fatalf("%s: validate %v, load %v; want both accepted", row.file, verr, lerr)
			}
			k.Close(ctx)
			continue
		}
		for what, e := range map[string]error{"validate": verr, "load": lerr} {
			if !errors.Is(e, errdefs.ErrInvalidArgument) || !strings.Contains(e.Error(), row.want) {
				t.Errorf("%s: %s: got %v, want invalid_argument containing %q", row.file, what, e, row.want)
			}
		}
		if verr != nil && lerr != nil && verr.Error() != lerr.Error() {
			t.Errorf("%s: validate says %q, load %q", row.file, verr, lerr)
		}
	}
	// The zero KernelConfig is the defaults.
	if err := ValidateKernel(kernelFile(t, "minmem"), doubleSpec, KernelConfig{}); err == nil || !strings.Contains(err.Error(), "limit of 4096 pages (256 MiB)") {
		t.Errorf("zero config: %v", err)
	}
}

// TestKernelWithoutTheCache: a kernel compiled without the file cache
// (it cannot be written) runs: it instantiates in the runtime that
// compiled it.
func TestKernelWithoutTheCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(unwritableCacheDir(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	k, err := eng.LoadKernel(ctx, kernelFile(t, "double"), doubleSpec, NewKernelConfig())
	if err != nil {
		t.Fatal(err)
	}
	y := make([]byte, 8)
	if err := k.Run(ctx, KernelArgs{Bufs: [][]byte{f32bytes(1, 2), y, nil}, Scalars: []uint64{0, 0, 2}}); err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := f32bytes(2, 4); string(y) != string(want) {
		t.Fatalf("y = %v, want %v", y, want)
	}
	if err := k.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := eng.inUncached.Load(k.compiled); ok {
		t.Error("the closed kernel is still listed as compiled without the cache")
	}
}

// TestKernelSubmitChecks: a launch whose arguments do not fit the
// declaration is refused at submit, naming the argument.
func TestKernelSubmitChecks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	k, err := eng.LoadKernel(ctx, kernelFile(t, "double"), doubleSpec, NewKernelConfig().WithMemoryLimit(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	defer p.Close()
	dev, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	prog, err := dev.PrepareKernel(doubleSpec.Info(), k.SimKernel())
	if err != nil {
		t.Fatal(err)
	}
	str, _ := dev.NewStream()
	defer str.Close(ctx)
	x, _ := dev.Alloc(64<<10, hw.AllocHostVisible, nil)
	y, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
	for _, row := range []struct {
		args []hw.Arg
		want string
	}{
		{[]hw.Arg{hw.BufferArg(x, 0, 16), hw.BufferArg(y, 0, -1)}, `kernel "double" takes 3 arguments, got 2`},
		{[]hw.Arg{hw.BufferArg(x, 0, 16), hw.Uint(1), hw.Uint(4)}, `argument 1 (y) is a buffer, got a scalar`},
		{[]hw.Arg{hw.BufferArg(x, 0, 16), hw.BufferArg(y, 0, -1), hw.BufferArg(y, 0, -1)}, `argument 2 (n) is a u32 scalar, got a buffer`},
		{[]hw.Arg{hw.BufferArg(x, 0, 6), hw.BufferArg(y, 0, -1), hw.Uint(1)}, `argument 0 (x): 6 bytes is not a whole number of f32 values`},
	} {
		_, err := str.Submit(&hw.Command{Program: prog, Args: row.args})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), row.want) {
			t.Errorf("submit: got %v, want invalid_argument containing %q", err, row.want)
		}
	}
	// Buffers larger than the kernel's memory limit: the launch fails,
	// out of budget.
	if _, err := str.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(4)}}); err != nil {
		t.Fatal(err)
	}
	err = str.Sync(ctx)
	if !errors.Is(err, errdefs.ErrFault) || !errors.Is(err, errdefs.ErrOutOfBudget) || !strings.Contains(err.Error(), "do not fit its memory limit of 65536 bytes") {
		t.Fatalf("oversized launch: %v", err)
	}
}

// TestKernelLostDevice: losing the device interrupts a spinning kernel.
func TestKernelLostDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	k, err := eng.LoadKernel(ctx, kernelFile(t, "loop"), doubleSpec, NewKernelConfig().WithTimeLimit(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p := sim.New()
	defer p.Close()
	dev, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	prog, _ := dev.PrepareKernel(doubleSpec.Info(), k.SimKernel())
	str, _ := dev.NewStream()
	x, _ := dev.Alloc(16, hw.AllocHostVisible, nil)
	c, err := str.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(x, 0, -1), hw.Uint(4)}})
	if err != nil {
		t.Fatal(err)
	}
	_ = c
	dev.Lose("test")
	if err := str.Sync(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("sync after loss: %v", err)
	}
	_ = str.Close(ctx)
}

// BenchmarkWasmKernelRun is one launch of the double kernel over 4
// floats, run directly: a fresh instance, the copies in and out, the call.
func BenchmarkWasmKernelRun(b *testing.B) {
	ctx := context.Background()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close(ctx)
	bin, err := os.ReadFile(filepath.Join("testdata", "kernels", "double.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	k, err := eng.LoadKernel(ctx, bin, doubleSpec, NewKernelConfig())
	if err != nil {
		b.Fatal(err)
	}
	args := KernelArgs{Bufs: [][]byte{f32bytes(1, 2, 3, 4), make([]byte, 16), nil}, Scalars: []uint64{0, 0, 4}}
	b.ReportAllocs()
	for b.Loop() {
		if err := k.Run(ctx, args); err != nil {
			b.Fatal(err)
		}
	}
}
