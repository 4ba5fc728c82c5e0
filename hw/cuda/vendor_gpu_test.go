package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// TestGPUVerifyPTX: the vendor PTX corpus against the real driver
// (testdata/vendor/README.md).
func TestGPUVerifyPTX(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	p := requireGPU(t)
	dev := p.Devices()[0].(*Device)
	for _, row := range []struct {
		name, file, entry string
		params            []ParamDecl
		want              string // "" for ok
	}{
		{"ok", "double.ptx", "double", doubleParams, ""},
		{"malformed", "malformed.ptx", "double", doubleParams, "malformed.ptx: the driver refuses the PTX (CUDA_ERROR_INVALID_PTX):\nmalformed.ptx:9:"},
		{"truncated", "truncated.ptx", "double", doubleParams, "truncated.ptx: the driver refuses the PTX (CUDA_ERROR_INVALID_PTX)"},
		{"layout", "double.ptx", "double", []ParamDecl{{"x", 8}, {"y", 8}, {"n", 8}}, "parameter 2 is 4 bytes, but argument 2 (n) is declared with 8 bytes"},
		{"scalar pointer", "read_scalar_ptr.ptx", "read_scalar_ptr", []ParamDecl{{"out", 8}, {"addr", 8}}, ""},
		{"store 0x10", "store_0x10.ptx", "store_0x10", nil, ""},
		{"spin", "spin.ptx", "spin", []ParamDecl{{"flag", 8}}, ""},
		{"trap", "trap.ptx", "trap_now", nil, ""},
		{"local huge", "local_huge.ptx", "local_huge", localHugeParams, "over the limit of 1073741824 bytes (max_local_memory)"},
	} {
		t.Run(row.name, func(t *testing.T) {
			start := time.Now()
			err := dev.VerifyPTX(vendorPTX(t, row.file), row.file, row.entry, row.params)
			t.Logf("%s: %v in %s", row.file, err, time.Since(start))
			if row.want == "" && err != nil {
				t.Fatal(err)
			}
			if row.want != "" && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), row.want)) {
				t.Fatalf("got %v, want invalid_argument containing %q", err, row.want)
			}
		})
	}
	// A launch over the device's limits is refused by the limits check.
	l := dev.LaunchLimits()
	t.Logf("launch limits %+v, compute capability %s", l, dev.ComputeCapability())
	if err := l.Check(&hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{l.MaxThreadsPerBlock + 1, 1, 1}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("block over the limit: %v", err)
	}
}

// localHugeParams is the declaration of testdata/vendor/local_huge.ptx:
// out buffer, i u32, j u32.
var localHugeParams = []ParamDecl{{"out", 8}, {"i", 4}, {"j", 4}}

// TestGPUPrepareVendorLocalMemory: the real driver's attributes of
// double.ptx (no local memory: admitted) and local_huge.ptx (480 KiB of
// local memory per thread: its worst-case reservation is refused at
// verification and at load under the default limit of 1 GiB). It logs
// every attribute read.
func TestGPUPrepareVendorLocalMemory(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	p := requireGPU(t)
	dev := p.Devices()[0].(*Device)
	res, err := dev.CheckVendor(vendorPTX(t, "double.ptx"), "double.ptx", "double", doubleParams, DefaultVendorLimits)
	t.Logf("double.ptx: %s; max threads per block %d; %d multiprocessors × %d threads = %d resident threads; reservation %d B; %v",
		res, res.MaxThreadsPerBlock, res.Multiprocessors, res.ThreadsPerMultiprocessor, res.ResidentThreads(), res.LocalReservation(), err)
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalBytes != 0 || res.StaticSharedBytes != 0 || res.Registers <= 0 || res.ResidentThreads() == 0 {
		t.Fatalf("double.ptx: %+v, want 0 B local, 0 B static shared, some registers", res)
	}
	start := time.Now()
	res, err = dev.CheckVendor(vendorPTX(t, "local_huge.ptx"), "local_huge.ptx", "local_huge", localHugeParams, DefaultVendorLimits)
	t.Logf("local_huge.ptx: %s; max threads per block %d; %d multiprocessors × %d threads = %d resident threads; reservation %d B (%.1f GiB); in %s: %v",
		res, res.MaxThreadsPerBlock, res.Multiprocessors, res.ThreadsPerMultiprocessor, res.ResidentThreads(), res.LocalReservation(),
		float64(res.LocalReservation())/(1<<30), time.Since(start), err)
	want := fmt.Sprintf("local_huge.ptx: .entry local_huge: %d bytes of local memory per thread × %d resident threads on %s", res.LocalBytes, res.ResidentThreads(), dev.Name())
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "over the limit of 1073741824 bytes (max_local_memory)") || res.LocalBytes < 480<<10 {
		t.Fatalf("local_huge.ptx: %v, want invalid_argument containing %q and the limit, at least 491520 B local", err, want)
	}
	info := hw.KernelInfo{Name: "lhuge", Args: []hw.KernelArg{hw.KernelBuffer("out", "u32", "out", ""), hw.KernelScalar("i", "u32"), hw.KernelScalar("j", "u32")}}
	_, err = dev.PrepareVendor(vendorPTX(t, "local_huge.ptx"), "local_huge.ptx", "local_huge", info)
	t.Logf("PrepareVendor local_huge.ptx: %v", err)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
		t.Fatalf("PrepareVendor local_huge.ptx: %v, want invalid_argument containing %q", err, want)
	}
	// 64 KiB of static shared memory, over MAX_SHARED_MEMORY_PER_BLOCK:
	// refused by the JIT or by the resources check (the log says which).
	shared := []byte(".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry shared_huge(.param .u64 out, .param .u32 i)\n{\n" +
		"\t.shared .align 4 .b8 big[65536];\n\t.reg .b32 %r<3>;\n\t.reg .b64 %rd<5>;\n\tld.param.u64 %rd1, [out];\n\tld.param.u32 %r1, [i];\n" +
		"\trem.u32 %r1, %r1, 16384;\n\tmov.u64 %rd2, big;\n\tmul.wide.u32 %rd3, %r1, 4;\n\tadd.s64 %rd4, %rd2, %rd3;\n\tst.shared.u32 [%rd4], %r1;\n" +
		"\tbar.sync 0;\n\tld.shared.u32 %r2, [%rd2];\n\tcvta.to.global.u64 %rd1, %rd1;\n\tst.global.u32 [%rd1], %r2;\n\tret;\n}\n")
	res, err = dev.CheckVendor(shared, "shared_huge.ptx", "shared_huge", []ParamDecl{{"out", 8}, {"i", 4}}, DefaultVendorLimits)
	t.Logf("shared_huge.ptx (64 KiB static shared): %s; %v", res, err)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("shared_huge.ptx: %v, want invalid_argument", err)
	}
	if err := dev.Err(); err != nil {
		t.Fatalf("the device after the refusals: %v", err)
	}
}

// hugePTX is a valid PTX kernel of n straight-line instructions: its JIT
// takes seconds (about 12–17 s for 100,000 lines on an H200).
func hugePTX(n int) []byte {
	var b strings.Builder
	b.WriteString(".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry huge(.param .u64 out)\n{\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<2>;\n\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, 1;\n")
	for i := range n {
		fmt.Fprintf(&b, "\tmad.lo.s32 %%r1, %%r1, %d, %%r1;\n", i|1)
	}
	b.WriteString("\tst.global.u32 [%rd1], %r1;\n\tret;\n}\n")
	return []byte(b.String())
}

// TestGPUJITTimeout: a JIT that outlasts its limit is killed in its
// child process and the kernel refused; a PTX that compiles is cached.
// The child is this package's stagehost binary, built here.
func TestGPUJITTimeout(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	requireGPU(t)
	if testing.Short() {
		t.Skip("builds stagehost")
	}
	dir := t.TempDir()
	ctx := context.Background()
	// This test binary is the child (TestMain, STAGEHOST_TEST_JIT=real):
	// the same RunJIT as `stagehost internal-jit`.
	cfg := JITConfig{Command: jitChild(t, "real"), CacheDir: dir, ComputeCapability: "test", DriverVersion: 1, Timeout: 2 * time.Second}
	start := time.Now()
	_, _, err := CompilePTX(ctx, cfg, "huge", hugePTX(100000))
	t.Logf("huge PTX: %v after %s", err, time.Since(start))
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("huge PTX: %v, want deadline_exceeded", err)
	}
	cfg.Timeout = time.Minute
	start = time.Now()
	cubin, cached, err := CompilePTX(ctx, cfg, "double", vendorPTX(t, "double.ptx"))
	t.Logf("double.ptx: %d bytes, cached %v, %v, in %s", len(cubin), cached, err, time.Since(start))
	if err != nil || cached {
		t.Fatal(err)
	}
	if _, cached, err = CompilePTX(ctx, cfg, "double", vendorPTX(t, "double.ptx")); err != nil || !cached {
		t.Fatalf("second compile: cached %v, %v", cached, err)
	}
	_, _, err = CompilePTX(ctx, cfg, "malformed", vendorPTX(t, "malformed.ptx"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("malformed: %v", err)
	}
}

// TestGPUPrepareVendor: the vendor PTX kernel "double" from its cubin
// (compiled in-process here) runs with its shape; a launch over the
// device's limits is refused at submit, nothing enqueued.
func TestGPUPrepareVendor(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	p := requireGPU(t)
	dev := p.Devices()[0].(*Device)
	info := hw.KernelInfo{Name: "vdouble", Args: []hw.KernelArg{
		hw.KernelBuffer("x", "f32", "in", ""), hw.KernelBuffer("y", "f32", "out", ""), hw.KernelScalar("n", "u32")}}
	prog, err := dev.PrepareVendor(vendorPTX(t, "double.ptx"), "double.ptx", "double", info)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	const n = 1000
	x, _ := dev.Alloc(4*n, 0, nil)
	y, _ := dev.Alloc(4*n, 0, nil)
	defer x.Free()
	defer y.Free()
	in := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(i)))
	}
	if _, err := s.Write(x, 0, in); err != nil {
		t.Fatal(err)
	}
	args := []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(n)}
	l := dev.LaunchLimits()
	if _, err := s.Submit(&hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{l.MaxThreadsPerBlock + 1, 1, 1}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("over the limits: %v", err)
	}
	if _, err := s.Submit(&hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{(n + 255) / 256, 1, 1}, Block: [3]uint32{256, 1, 1}}}); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*n)
	if _, err := s.Read(y, 0, out); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); got != 2*float32(i) {
			t.Fatalf("y[%d] = %v, want %v", i, got, 2*float32(i))
		}
	}
}
