package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
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
