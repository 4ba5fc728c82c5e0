package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// The fake driver's vendor-kernel entry points: parameter layouts read
// from the PTX text of the loaded modules, and the attributes of an H200.

var ptxParam = regexp.MustCompile(`\.param\s+\.[busf](\d+)\s+\w+`)

func (f *fakeDriver) FuncGetParamInfo(fn cuFunction, index int) (uintptr, uintptr, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noParamInfo {
		return 0, 0, cudaErrorNotSupported
	}
	name, ok := f.funcs[fn]
	if !ok {
		return 0, 0, cudaErrorInvalidHandle
	}
	if text, ok := f.modules[f.funcMods[fn]]; ok {
		i := strings.Index(text, ".entry "+name+"(")
		sig := text[i:]
		sig = sig[:strings.IndexByte(sig, ')')]
		var off uintptr
		for j, m := range ptxParam.FindAllStringSubmatch(sig, -1) {
			size := uintptr(0)
			for _, c := range m[1] {
				size = size*10 + uintptr(c-'0')
			}
			size /= 8
			off = (off + size - 1) &^ (size - 1)
			if j == index {
				return off, size, cudaSuccess
			}
			off += size
		}
		return 0, 0, cudaErrorInvalidValue
	}
	return 0, 0, cudaErrorInvalidHandle
}

func (f *fakeDriver) DeviceGetAttribute(attr int32, dev cuDevice) (int32, cuResult) {
	switch attr {
	case attrMaxThreadsPerBlock:
		return 1024, cudaSuccess
	case attrMaxBlockDimX, attrMaxBlockDimX + 1:
		return 1024, cudaSuccess
	case attrMaxBlockDimX + 2:
		return 64, cudaSuccess
	case attrMaxGridDimX:
		return 1<<31 - 1, cudaSuccess
	case attrMaxGridDimX + 1, attrMaxGridDimX + 2:
		return 65535, cudaSuccess
	case attrMaxSharedPerBlock:
		return 48 << 10, cudaSuccess
	case attrCCMajor:
		return 9, cudaSuccess
	case attrCCMinor:
		return 0, cudaSuccess
	}
	return 0, cudaErrorInvalidValue
}

func vendorPTX(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vendor", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// doubleParams is the declaration of testdata/vendor/double.ptx:
// x buffer, y buffer, n u32.
var doubleParams = []ParamDecl{{"x", 8}, {"y", 8}, {"n", 4}}

// TestVerifyPTXFake: the PTX checks against the fake driver, each row's
// outcome exact.
func TestVerifyPTXFake(t *testing.T) {
	f := newFake(1)
	p, err := Open(NewConfig().withDriver(f))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dev := p.Devices()[0].(*Device)
	for _, row := range []struct {
		name, file, entry string
		params            []ParamDecl
		noParamInfo       bool
		class             error
		want              string
	}{
		{name: "ok", file: "double.ptx", entry: "double", params: doubleParams},
		{name: "malformed", file: "malformed.ptx", entry: "double", params: doubleParams, class: errdefs.ErrInvalidArgument,
			want: "malformed.ptx: the driver refuses the PTX (CUDA_ERROR_INVALID_PTX):\nmalformed.ptx:9: error   : Not a name of any known instruction: 'frobnicate'"},
		{name: "truncated", file: "truncated.ptx", entry: "double", params: doubleParams, class: errdefs.ErrInvalidArgument,
			want: "truncated.ptx: the driver refuses the PTX (CUDA_ERROR_INVALID_PTX):\ntruncated.ptx:1: fatal"},
		{name: "scalar pointer", file: "read_scalar_ptr.ptx", entry: "read_scalar_ptr", params: []ParamDecl{{"out", 8}, {"addr", 8}}},
		{name: "store 0x10", file: "store_0x10.ptx", entry: "store_0x10"},
		{name: "spin", file: "spin.ptx", entry: "spin", params: []ParamDecl{{"flag", 8}}},
		{name: "trap", file: "trap.ptx", entry: "trap_now"},
		{name: "no entry", file: "double.ptx", entry: "triple", params: doubleParams, class: errdefs.ErrInvalidArgument,
			want: `double.ptx: no .entry "triple" (CUDA_ERROR_NOT_FOUND)`},
		{name: "size mismatch", file: "double.ptx", entry: "double", params: []ParamDecl{{"x", 8}, {"y", 8}, {"n", 8}}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: parameter 2 is 4 bytes, but argument 2 (n) is declared with 8 bytes"},
		{name: "too few declared", file: "double.ptx", entry: "double", params: doubleParams[:2], class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double has 3 parameters, the declaration 2: parameter 2 (4 bytes at offset 16) is not declared"},
		{name: "too many declared", file: "double.ptx", entry: "double", params: append(doubleParams[:3:3], ParamDecl{"m", 4}), class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double has 3 parameters, the declaration 4: argument 3 (m) has no parameter"},
		{name: "no cuFuncGetParamInfo", file: "double.ptx", entry: "double", params: doubleParams, noParamInfo: true, class: errdefs.ErrUnsupported,
			want: "the driver lacks cuFuncGetParamInfo (CUDA 12.4 or later)"},
	} {
		t.Run(row.name, func(t *testing.T) {
			f.mu.Lock()
			f.noParamInfo = row.noParamInfo
			f.mu.Unlock()
			err := dev.VerifyPTX(vendorPTX(t, row.file), row.file, row.entry, row.params)
			if row.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, row.class) || !strings.Contains(err.Error(), row.want) {
				t.Fatalf("got %v, want %v containing %q", err, row.class, row.want)
			}
		})
	}
	// The fake H200's limits come from its attributes.
	if l := dev.LaunchLimits(); l.MaxThreadsPerBlock != 1024 || l.MaxBlock[2] != 64 || l.MaxGrid[1] != 65535 || l.MaxSharedBytes != 48<<10 {
		t.Fatalf("limits %+v", l)
	}
	if cc := dev.ComputeCapability(); cc != "9.0" {
		t.Fatalf("compute capability %q", cc)
	}
}

// TestMapJITLog: the JIT log's positions become file:line.
func TestMapJITLog(t *testing.T) {
	log := "ptxas application ptx input, line 12; error   : Unknown symbol 'r9'\nptxas fatal   : Ptx assembly aborted due to errors\n"
	want := "kernels/x.ptx:12: error   : Unknown symbol 'r9'\nptxas fatal   : Ptx assembly aborted due to errors"
	if got := MapJITLog(log, "kernels/x.ptx"); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// fakePTXErrors is the fake JIT's check: unbalanced braces (a truncated
// image), or an instruction it does not know (frobnicate), reported with
// ptxas's position format.
func fakePTXErrors(text string) (string, bool) {
	if strings.Count(text, "{") != strings.Count(text, "}") {
		return "ptxas application ptx input, line 1; fatal   : Parsing error near '': syntax error", true
	}
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "frobnicate") {
			return fmt.Sprintf("ptxas application ptx input, line %d; error   : Not a name of any known instruction: 'frobnicate'\nptxas fatal   : Ptx assembly aborted due to errors", i+1), true
		}
	}
	return "", false
}

// TestPrepareVendorFake: a vendor PTX kernel prepared on the fake GPU
// runs with its shape; a launch without a shape, over the device's
// limits (block, shared memory, grid) or with arguments off its
// declaration is refused at submit, with nothing enqueued, and the stream
// works after; a layout mismatch is refused at prepare.
func TestPrepareVendorFake(t *testing.T) {
	f := newFake(1)
	p, err := Open(NewConfig().withDriver(f))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dev := p.Devices()[0].(*Device)
	info := hw.KernelInfo{Name: "vdouble", Args: []hw.KernelArg{
		hw.KernelBuffer("x", "f32", "in", ""), hw.KernelBuffer("y", "f32", "out", ""), hw.KernelScalar("n", "u32")}}
	bad := info
	bad.Args = []hw.KernelArg{info.Args[0], info.Args[1], hw.KernelScalar("n", "u64")}
	if _, err := dev.PrepareVendor(vendorPTX(t, "double.ptx"), "double.ptx", "double", bad); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "parameter 2 is 4 bytes, but argument 2 (n) is declared with 8 bytes") {
		t.Fatalf("layout mismatch: %v", err)
	}
	prog, err := dev.PrepareVendor(vendorPTX(t, "double.ptx"), "double.ptx", "double", info)
	if err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer s.Close(ctx)
	x, _ := dev.Alloc(16, 0, nil)
	y, _ := dev.Alloc(16, 0, nil)
	defer x.Free()
	defer y.Free()
	in := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40} // 1, 2, 3, 4
	if _, err := s.Write(x, 0, in); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	args := []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(4)}
	shape := &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{4, 1, 1}}
	for _, row := range []struct {
		name string
		cmd  hw.Command
		want string
	}{
		{"no shape", hw.Command{Program: prog, Args: args}, "vdouble is a vendor kernel: it is launched with a shape (stream_launch)"},
		{"over limits", hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 128}}}, "block.z = 128, over the device's limit of 64"},
		{"shared over", hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}, SharedBytes: 1 << 20}}, "1048576 bytes of shared memory, over the device's limit of 49152"},
		{"shared one over", hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}, SharedBytes: 48<<10 + 1}}, "launch shape: 49153 bytes of shared memory, over the device's limit of 49152"},
		{"grid over", hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 65536, 1}, Block: [3]uint32{1, 1, 1}}}, "launch shape: grid.y = 65536, over the device's limit of 65535"},
		{"grid x over", hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1 << 31, 1, 1}, Block: [3]uint32{1, 1, 1}}}, "launch shape: grid.x = 2147483648, over the device's limit of 2147483647"},
		{"arg count", hw.Command{Program: prog, Args: args[:2], Shape: shape}, "vdouble takes 3 arguments, got 2"},
		{"arg kind", hw.Command{Program: prog, Args: []hw.Arg{args[0], hw.Uint(1), args[2]}, Shape: shape}, "argument 1 (y): the kind does not match its declaration (buffer f32)"},
		{"u32 range", hw.Command{Program: prog, Args: []hw.Arg{args[0], args[1], hw.Uint(1 << 40)}, Shape: shape}, "does not fit a u32"},
	} {
		st := s.(*Stream)
		submitted, launched := st.rec.Submitted(), f.launching.Load()
		if _, err := s.Submit(&row.cmd); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), row.want) {
			t.Errorf("%s: got %v, want invalid_argument containing %q", row.name, err, row.want)
		}
		// Refused at submit: nothing enqueued, nothing reached the driver.
		if st.rec.Submitted() != submitted || f.launching.Load() != launched || !s.Idle() {
			t.Errorf("%s: enqueued: submitted %d → %d, launches %d → %d, idle %v", row.name, submitted, st.rec.Submitted(), launched, f.launching.Load(), s.Idle())
		}
	}
	if _, err := s.Submit(&hw.Command{Program: prog, Args: args, Shape: shape}); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 16)
	if _, err := s.Read(y, 0, out); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []byte{0, 0, 0, 0x40, 0, 0, 0x80, 0x40, 0, 0, 0xc0, 0x40, 0, 0, 0, 0x41}; string(out) != string(want) {
		t.Fatalf("y = %x, want %x", out, want)
	}
}
