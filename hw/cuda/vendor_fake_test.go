package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// ptxArray matches a .local or .shared array declared in PTX.
var ptxArray = regexp.MustCompile(`\.(local|shared)\s+(?:\.align\s+\d+\s+)?\.b8\s+\w+\[(\d+)\]`)

// FuncGetAttribute answers as a driver would for the loaded PTX: its
// .local and .shared arrays' sizes, 16 registers and 1024 threads per
// block, unless the test set funcAttrs, funcAttrFail or noFuncAttr.
func (f *fakeDriver) FuncGetAttribute(attr int32, fn cuFunction) (int32, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.noFuncAttr:
		return 0, cudaErrorNotSupported
	case f.funcAttrFail != cudaSuccess:
		return 0, f.funcAttrFail
	}
	name, ok := f.funcs[fn]
	if !ok {
		return 0, cudaErrorInvalidHandle
	}
	if v, ok := f.funcAttrs[attr]; ok {
		return v, cudaSuccess
	}
	switch attr {
	case funcAttrNumRegs:
		return 16, cudaSuccess
	case funcAttrMaxThreadsPerBlock:
		return 1024, cudaSuccess
	case funcAttrLocalSizeBytes, funcAttrSharedSizeBytes:
		text := f.modules[f.funcMods[fn]]
		body := text[strings.Index(text, ".entry "+name+"("):]
		space := "local"
		if attr == funcAttrSharedSizeBytes {
			space = "shared"
		}
		var n int32
		for _, m := range ptxArray.FindAllStringSubmatch(body, -1) {
			if m[1] == space {
				v, _ := strconv.Atoi(m[2])
				n += int32(v)
			}
		}
		return n, cudaSuccess
	}
	return 0, cudaErrorInvalidValue
}

func (f *fakeDriver) DeviceGetAttribute(attr int32, dev cuDevice) (int32, cuResult) {
	switch attr {
	case attrMultiprocessors:
		return 132, cudaSuccess
	case attrMaxThreadsPerSM:
		return 2048, cudaSuccess
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

// TestCheckVendorResourcesFake: a vendor kernel's resources read from
// the fake H200 (132 multiprocessors × 2048 threads = 270,336 resident
// threads) against its limits, each row's outcome exact: under and at
// the local memory limit it is admitted, one byte over refused naming
// the file, the entry, the bytes per thread, the resident threads, the
// product and the limit; static shared memory over the device's
// per-block limit is refused; cuFuncGetAttribute failing or absent
// refuses the kernel.
func TestCheckVendorResourcesFake(t *testing.T) {
	f := newFake(1)
	p, err := Open(NewConfig().withDriver(f))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dev := p.Devices()[0].(*Device)
	const resident = 132 * 2048
	for _, row := range []struct {
		name, file, entry string
		params            []ParamDecl
		attrs             map[int32]int32
		fail              cuResult
		absent            bool
		lim               VendorLimits
		class             error
		want              string // the whole error, or "" for none
		local             uint64 // for none: the resources' LocalBytes
	}{
		{name: "double", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits},
		{name: "local under the limit", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			attrs: map[int32]int32{funcAttrLocalSizeBytes: 3971}, local: 3971}, // 1,073,504,256 B
		{name: "local at the limit", file: "double.ptx", entry: "double", params: doubleParams, lim: VendorLimits{MaxLocalMemory: 4096 * resident},
			attrs: map[int32]int32{funcAttrLocalSizeBytes: 4096}, local: 4096},
		{name: "local one over", file: "double.ptx", entry: "double", params: doubleParams, lim: VendorLimits{MaxLocalMemory: 4096*resident - 1},
			attrs: map[int32]int32{funcAttrLocalSizeBytes: 4096}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: 4096 bytes of local memory per thread × 270336 resident threads on cuda0 (132 multiprocessors × 2048) = 1107296256 bytes, over the limit of 1107296255 bytes (max_local_memory)"},
		{name: "local just over the default", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			attrs: map[int32]int32{funcAttrLocalSizeBytes: 3972}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: 3972 bytes of local memory per thread × 270336 resident threads on cuda0 (132 multiprocessors × 2048) = 1073774592 bytes, over the limit of 1073741824 bytes (max_local_memory)"},
		{name: "local_huge.ptx", file: "local_huge.ptx", entry: "local_huge", params: localHugeParams, lim: DefaultVendorLimits, class: errdefs.ErrInvalidArgument,
			want: "local_huge.ptx: .entry local_huge: 491520 bytes of local memory per thread × 270336 resident threads on cuda0 (132 multiprocessors × 2048) = 132875550720 bytes, over the limit of 1073741824 bytes (max_local_memory)"},
		{name: "zero limit, no local memory", file: "double.ptx", entry: "double", params: doubleParams},
		{name: "zero limit, 1 byte", file: "double.ptx", entry: "double", params: doubleParams,
			attrs: map[int32]int32{funcAttrLocalSizeBytes: 1}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: 1 bytes of local memory per thread × 270336 resident threads on cuda0 (132 multiprocessors × 2048) = 270336 bytes, over the limit of 0 bytes (max_local_memory)"},
		{name: "static shared at the limit", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			attrs: map[int32]int32{funcAttrSharedSizeBytes: 48 << 10}},
		{name: "static shared over", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			attrs: map[int32]int32{funcAttrSharedSizeBytes: 48<<10 + 1}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: 49153 bytes of static shared memory per block, over cuda0's limit of 49152 bytes (MAX_SHARED_MEMORY_PER_BLOCK)"},
		{name: "attribute call fails", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			fail: cudaErrorInvalidHandle, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: cuFuncGetAttribute(LOCAL_SIZE_BYTES): CUDA_ERROR_INVALID_HANDLE"},
		{name: "attribute call loses the device", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			fail: cudaErrorIllegalAddress, class: errdefs.ErrDeviceLost,
			want: "cuda: cuda0: cuFuncGetAttribute: CUDA_ERROR_ILLEGAL_ADDRESS"},
		{name: "negative attribute", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			attrs: map[int32]int32{funcAttrLocalSizeBytes: -1}, class: errdefs.ErrInvalidArgument,
			want: "double.ptx: .entry double: cuFuncGetAttribute(LOCAL_SIZE_BYTES) = -1"},
		{name: "no cuFuncGetAttribute", file: "double.ptx", entry: "double", params: doubleParams, lim: DefaultVendorLimits,
			absent: true, class: errdefs.ErrUnsupported,
			want: "double.ptx: .entry double: the driver lacks cuFuncGetAttribute, so the kernel's local memory cannot be bounded"},
	} {
		t.Run(row.name, func(t *testing.T) {
			f.mu.Lock()
			f.funcAttrs, f.funcAttrFail, f.noFuncAttr = row.attrs, row.fail, row.absent
			f.mu.Unlock()
			defer func() {
				f.mu.Lock()
				f.funcAttrs, f.funcAttrFail, f.noFuncAttr = nil, cudaSuccess, false
				f.mu.Unlock()
			}()
			res, err := dev.CheckVendor(vendorPTX(t, row.file), row.file, row.entry, row.params, row.lim)
			if row.want != "" {
				if !errors.Is(err, row.class) || err.Error() != row.want {
					t.Fatalf("got %v, want %v: %q", err, row.class, row.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.LocalBytes != row.local || res.Registers != 16 || res.MaxThreadsPerBlock != 1024 ||
				res.ResidentThreads() != resident || res.LocalReservation() != row.local*resident {
				t.Fatalf("resources %+v", res)
			}
		})
	}
	// check's verified line shows them.
	res, err := dev.CheckVendor(vendorPTX(t, "double.ptx"), "double.ptx", "double", doubleParams, DefaultVendorLimits)
	if err != nil || res.String() != "16 registers, 0 B local, 0 B static shared" {
		t.Fatalf("double: %q, %v", res.String(), err)
	}
	// VerifyPTX applies the default limit.
	if err := dev.VerifyPTX(vendorPTX(t, "local_huge.ptx"), "local_huge.ptx", "local_huge", localHugeParams); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "over the limit of 1073741824 bytes (max_local_memory)") {
		t.Fatalf("VerifyPTX local_huge.ptx: %v", err)
	}
	// The saturating product.
	if r := (KernelResources{LocalBytes: 1 << 40, Multiprocessors: 1 << 20, ThreadsPerMultiprocessor: 1 << 20}); r.LocalReservation() != ^uint64(0) {
		t.Fatalf("reservation %d, want saturated", r.LocalReservation())
	}
}

// TestPrepareVendorLocalMemoryFake: a tenant's worker loading a kernel
// over its local memory limit is refused with the same error as check,
// and the module is unloaded; under the limit it loads.
func TestPrepareVendorLocalMemoryFake(t *testing.T) {
	f := newFake(1)
	p, err := Open(NewConfig().withDriver(f))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dev := p.Devices()[0].(*Device)
	info := hw.KernelInfo{Name: "lhuge", Args: []hw.KernelArg{hw.KernelBuffer("out", "u32", "out", ""), hw.KernelScalar("i", "u32"), hw.KernelScalar("j", "u32")}}
	unloads := f.unloads.Load()
	want := "local_huge.ptx: .entry local_huge: 491520 bytes of local memory per thread × 270336 resident threads on cuda0 (132 multiprocessors × 2048) = 132875550720 bytes, over the limit of 1073741824 bytes (max_local_memory)"
	if _, err := dev.PrepareVendor(vendorPTX(t, "local_huge.ptx"), "local_huge.ptx", "local_huge", info); !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != want {
		t.Fatalf("PrepareVendor: %v, want %q", err, want)
	}
	if n := f.unloads.Load(); n != unloads+1 {
		t.Fatalf("the refused module stayed loaded: %d unloads → %d", unloads, n)
	}
	dev.vendorMu.Lock()
	kept := len(dev.vendorMods)
	dev.vendorMu.Unlock()
	if kept != 0 {
		t.Fatalf("%d vendor modules kept after the refusal", kept)
	}
	// A limit of its reservation admits it.
	if _, err := dev.PrepareVendorLimits(vendorPTX(t, "local_huge.ptx"), "local_huge.ptx", "local_huge", info, VendorLimits{MaxLocalMemory: 491520 * 132 * 2048}); err != nil {
		t.Fatal(err)
	}
}

// TestFuncGetAttributeSymbolMissing: cuFuncGetAttribute is optional in
// the symbol table; without it the library driver answers
// CUDA_ERROR_NOT_SUPPORTED (which CheckVendor turns into unsupported)
// and calls nothing.
func TestFuncGetAttributeSymbolMissing(t *testing.T) {
	s, err := loadSymbols(func(name string) (uintptr, error) {
		if name == "cuFuncGetAttribute" {
			return 0, errors.New("undefined symbol")
		}
		return 0x3000, nil
	})
	if err != nil {
		t.Fatalf("an optional symbol missing: %v", err)
	}
	if len(s.missingOptional) != 1 || s.missingOptional[0] != "cuFuncGetAttribute" || s.cuFuncGetAttribute != 0 {
		t.Fatalf("missing %v, address %#x", s.missingOptional, s.cuFuncGetAttribute)
	}
	if _, r := (&libDriver{sym: s}).FuncGetAttribute(funcAttrLocalSizeBytes, 0x1234); r != cudaErrorNotSupported {
		t.Fatalf("FuncGetAttribute without the symbol: %v", r)
	}
}
