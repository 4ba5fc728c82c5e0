package cuda

import (
	"context"
	"errors"
	"math"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/testutil"
)

func TestLoadSymbolsReportsEveryMissingSymbol(t *testing.T) {
	absent := map[string]bool{"cuMemAlloc_v2": true, "cuLaunchKernel": true, "cuEventQuery": true, "cuGraphLaunch": true}
	var asked []string
	_, err := loadSymbols(func(name string) (uintptr, error) {
		asked = append(asked, name)
		if absent[name] {
			return 0, errors.New("undefined symbol")
		}
		return 0x1000, nil
	})
	if !errors.Is(err, errdefs.ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
	for _, name := range []string{"cuMemAlloc_v2", "cuLaunchKernel", "cuEventQuery"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
	if strings.Contains(err.Error(), "cuGraphLaunch") {
		t.Errorf("error %q names an optional symbol", err)
	}
	if !strings.Contains(err.Error(), "3 required") {
		t.Errorf("error %q does not count the missing symbols", err)
	}
	// Every field of the table was looked up, with the versioned names.
	if n := reflect.TypeFor[symbols]().NumField() - 2; len(asked) != n {
		t.Errorf("looked up %d symbols, table has %d", len(asked), n)
	}
	for _, want := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
		"cuMemHostGetDevicePointer_v2", "cuStreamDestroy_v2", "cuEventDestroy_v2", "cuDevicePrimaryCtxRelease_v2", "cuMemsetD8_v2"} {
		if !contains(asked, want) {
			t.Errorf("%s was not looked up", want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestLoadSymbolsOptionalOnly(t *testing.T) {
	s, err := loadSymbols(func(name string) (uintptr, error) {
		if strings.Contains(name, "Graph") || strings.Contains(name, "Capture") {
			return 0, nil
		}
		return 0x2000, nil
	})
	if err != nil {
		t.Fatalf("optional symbols missing: %v", err)
	}
	if s.graphsLoaded || len(s.missingOptional) != 6 || s.cuDevicePrimaryCtxReset == 0 {
		t.Fatalf("graphsLoaded=%v missing=%v", s.graphsLoaded, s.missingOptional)
	}
	if s.cuLaunchKernel != 0x2000 || s.cuMemAlloc != 0x2000 {
		t.Fatalf("fields not filled: %+v", s)
	}
	d := &libDriver{sym: s}
	if d.HasGraphs() {
		t.Fatal("HasGraphs with graph symbols missing")
	}
}

func TestOpenWithoutLibrary(t *testing.T) {
	_, err := Open(NewConfig().WithLibrary("/nonexistent/libcuda.so.1"))
	if !errors.Is(err, errdefs.ErrUnsupported) {
		t.Fatalf("Open = %v, want ErrUnsupported", err)
	}
	if !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("error %q lacks the dlopen reason", err)
	}
}

// TestPTXMatchesParameterTable parses the embedded PTX and checks each
// entry's parameters against what pack produces: count, and which slots
// are 32-bit scalars.
func TestPTXMatchesParameterTable(t *testing.T) {
	src := string(kernelsPTX)
	entry := regexp.MustCompile(`(?s)\.visible \.entry (\w+)\((.*?)\)`)
	param := regexp.MustCompile(`\.param \.(\w+) `)
	decl := map[string][]string{}
	for _, m := range entry.FindAllStringSubmatch(src, -1) {
		var types []string
		for _, p := range param.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
		}
		decl[m[1]] = types
	}
	entries := map[string]bool{}
	for _, k := range kernels {
		entries[k.ptxEntry()] = true
	}
	if len(decl) != len(entries) {
		t.Errorf("PTX declares %d entries, the table uses %d", len(decl), len(entries))
	}
	checkOpEntries(t, decl)
	// The parameter types each kernel must declare (kernels.cu).
	want := map[string][]string{
		"noop": nil, "fault": nil,
		"fill":                  {"u64", "f32", "u64"},
		"copy":                  {"u64", "u64", "u64"},
		"saxpy":                 {"f32", "u64", "u64", "u64"},
		"matmul":                {"u64", "u64", "u64", "u32", "u32", "u32"},
		"bias":                  {"u64", "u64", "u32", "u32"},
		"relu":                  {"u64", "u64"},
		"argmax":                {"u64", "u64", "u64"},
		"mlp_forward":           {"u64", "u64", "u64", "u64", "u64", "u64", "u64", "u32", "u32", "u32"},
		"spin":                  {"u64", "u64", "u32"},
		"resident_gpu_exchange": {"u64", "u64", "u32"},
	}
	for _, k := range baseKernels {
		got, ok := decl[k.name]
		if !ok {
			t.Errorf("PTX lacks entry %s", k.name)
			continue
		}
		if !reflect.DeepEqual(got, want[k.name]) {
			t.Errorf("%s: PTX parameters %v, want %v", k.name, got, want[k.name])
		}
		// pack with plausible arguments yields as many parameters.
		var a [hw.MaxArgs]resolved
		for i, ka := range k.args {
			switch ka.kind {
			case argF32s: // one value (1×1 matrices), apart from the other ranges
				a[i] = resolved{isBuf: true, ptr: 0x10000 + 0x100*uint64(i), len: 4}
			case argBytes:
				a[i] = resolved{isBuf: true, ptr: 0x20000 + 0x100*uint64(i), len: 8}
			case argU64:
				a[i] = resolved{val: 0}
			default:
				a[i] = resolved{val: 1}
			}
		}
		if k.id == kResident {
			a[1] = resolved{isBuf: true, ptr: 0x30000, len: residentPayloadBytes}
		}
		var p [maxParams]uint64
		n, _, err := pack(k, a[:len(k.args)], &p)
		if err != nil {
			t.Errorf("%s: pack: %v", k.name, err)
			continue
		}
		if n != len(want[k.name]) {
			t.Errorf("%s: pack produced %d parameters, PTX declares %d", k.name, n, len(want[k.name]))
		}
	}
	if !strings.Contains(src, ".target sm_90") {
		t.Errorf("PTX is not built for sm_90")
	}
}

func newFakePlatform(t *testing.T, ndev int, cfgs ...Config) (*Platform, *fakeDriver) {
	t.Helper()
	f := newFake(ndev)
	cfg := NewConfig()
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	p, err := Open(cfg.withDriver(f))
	if err != nil {
		t.Fatalf("Open(fake): %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("platform Close: %v", err)
		}
		if n := f.wrongThread.Load(); n != 0 {
			t.Errorf("%d driver calls ran on a thread without the right context", n)
		}
	})
	return p, f
}

func TestValidateArguments(t *testing.T) {
	p, _ := newFakePlatform(t, 2)
	d0, d1 := p.devices[0], p.devices[1]
	buf := func(d *Device, n int) hw.Buffer {
		b, err := d.Alloc(n, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		return b
	}
	a, other, small := buf(d0, 1024), buf(d1, 1024), buf(d0, 8)
	freed := buf(d0, 64)
	freed.Free()
	prog := func(d *Device, name string) hw.Program { pr, _ := d.Prepare(name); return pr }
	all := func(b hw.Buffer) hw.Arg { return hw.BufferArg(b, 0, -1) }
	// mlp_forward with I=2, H=3, C=2, all in a: x [0,8), W1 [8,32), b1
	// [32,44), W2 [44,68), b2 [68,76), scores [76,84), out [84,92); mlp(i,
	// v) replaces argument i with v (i < 0: drops the last one).
	mlpArgs := []hw.Arg{hw.BufferArg(a, 0, 8), hw.BufferArg(a, 8, 24), hw.BufferArg(a, 32, 12), hw.BufferArg(a, 44, 24),
		hw.BufferArg(a, 68, 8), hw.BufferArg(a, 76, 8), hw.BufferArg(a, 84, 8), hw.Uint(2), hw.Uint(3), hw.Uint(2)}
	mlp := func(i int, v hw.Arg) hw.Command {
		args := slices.Clone(mlpArgs)
		if i < 0 {
			args = args[:len(args)-1]
		} else {
			args[i] = v
		}
		return hw.Command{Program: prog(d0, "mlp_forward"), Args: args}
	}
	cases := []struct {
		name  string
		cmd   hw.Command
		class error
		msg   string
	}{
		{"no program", hw.Command{}, errdefs.ErrInvalidArgument, "no program"},
		{"foreign program", hw.Command{Program: prog(d1, "noop")}, errdefs.ErrInvalidArgument, "belongs to cuda1"},
		{"arg count", hw.Command{Program: prog(d0, "fill"), Args: []hw.Arg{all(a)}}, errdefs.ErrInvalidArgument, "takes 2 argument(s), got 1"},
		{"scalar for buffer", hw.Command{Program: prog(d0, "fill"), Args: []hw.Arg{hw.Uint(1), hw.Float32(1)}}, errdefs.ErrInvalidArgument, "argument 0 must be a float32 buffer range"},
		{"buffer for scalar", hw.Command{Program: prog(d0, "fill"), Args: []hw.Arg{all(a), all(a)}}, errdefs.ErrInvalidArgument, "argument 1 must be a float32 scalar"},
		{"scalar for buffer (bytes)", hw.Command{Program: prog(d0, "copy"), Args: []hw.Arg{all(a), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "argument 1 must be a buffer range"},
		{"noop takes anything", hw.Command{Program: prog(d0, "noop"), Args: []hw.Arg{all(other)}}, errdefs.ErrInvalidArgument, "argument 0: buffer belongs to cuda1"},
		{"copy lengths", hw.Command{Program: prog(d0, "copy"), Args: []hw.Arg{hw.BufferArg(a, 0, 10), hw.BufferArg(a, 100, 11)}}, errdefs.ErrInvalidArgument, "dst has 10 bytes, src 11"},
		{"saxpy lengths", hw.Command{Program: prog(d0, "saxpy"), Args: []hw.Arg{hw.Float32(1), hw.BufferArg(a, 0, 8), hw.BufferArg(a, 8, 12)}}, errdefs.ErrInvalidArgument, "x has 2 values, y 3"},
		{"partial float", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{hw.BufferArg(a, 0, 6)}}, errdefs.ErrInvalidArgument, "not 4-byte aligned whole float32"},
		{"matmul A large", hw.Command{Program: prog(d0, "matmul"), Args: []hw.Arg{hw.BufferArg(a, 0, 20), hw.BufferArg(a, 0, 16), hw.BufferArg(a, 0, 16), hw.Uint(2), hw.Uint(2), hw.Uint(2)}}, errdefs.ErrInvalidArgument, "argument 0 has 20 bytes"},
		{"argmax empty", hw.Command{Program: prog(d0, "argmax"), Args: []hw.Arg{hw.BufferArg(a, 0, 0), hw.BufferArg(a, 0, 8)}}, errdefs.ErrInvalidArgument, "has 0 values"},
		{"spin offset", hw.Command{Program: prog(d0, "spin"), Args: []hw.Arg{hw.BufferArg(a, 0, 16), hw.Uint(13), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "offset 13 outside"},
		{"spin unaligned", hw.Command{Program: prog(d0, "spin"), Args: []hw.Arg{hw.BufferArg(a, 1, 16), hw.Uint(4), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "not 4-byte aligned"},
		{"other device", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{all(other)}}, errdefs.ErrInvalidArgument, "argument 0: buffer belongs to cuda1"},
		{"freed", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{all(freed)}}, errdefs.ErrClosed, "argument 0"},
		{"past end", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{hw.BufferArg(a, 1000, 100)}}, errdefs.ErrInvalidArgument, "argument 0: range"},
		{"negative offset", hw.Command{Program: prog(d0, "copy"), Args: []hw.Arg{all(a), {Buffer: a, Offset: -4, Length: 4}}}, errdefs.ErrInvalidArgument, "argument 1: range"},
		{"negative length", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{{Buffer: a, Offset: 0, Length: -1}}}, errdefs.ErrInvalidArgument, "argument 0: range"},
		{"misaligned", hw.Command{Program: prog(d0, "relu"), Args: []hw.Arg{hw.BufferArg(a, 2, 8)}}, errdefs.ErrInvalidArgument, "not 4-byte aligned"},
		{"u32 overflow", hw.Command{Program: prog(d0, "bias"), Args: []hw.Arg{all(a), all(a), hw.Uint(1 << 32), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "argument 2 must be a uint32"},
		{"matmul A small", hw.Command{Program: prog(d0, "matmul"), Args: []hw.Arg{all(small), all(a), all(a), hw.Uint(2), hw.Uint(2), hw.Uint(2)}}, errdefs.ErrInvalidArgument, "argument 0 has 8 bytes, want 2×2"},
		{"matmul C small", hw.Command{Program: prog(d0, "matmul"), Args: []hw.Arg{hw.BufferArg(a, 0, 64), hw.BufferArg(a, 0, 64), all(small), hw.Uint(16), hw.Uint(16), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "argument 2"},
		{"matmul overflow", hw.Command{Program: prog(d0, "matmul"), Args: []hw.Arg{all(a), all(a), all(a), hw.Uint(math.MaxUint32), hw.Uint(math.MaxUint32), hw.Uint(math.MaxUint32)}}, errdefs.ErrInvalidArgument, "argument 0"},
		{"bias b small", hw.Command{Program: prog(d0, "bias"), Args: []hw.Arg{hw.BufferArg(a, 0, 16), all(small), hw.Uint(1), hw.Uint(4)}}, errdefs.ErrInvalidArgument, "argument 1"},
		{"argmax out small", hw.Command{Program: prog(d0, "argmax"), Args: []hw.Arg{all(a), hw.BufferArg(a, 0, 4)}}, errdefs.ErrInvalidArgument, "argument 1 has 4 bytes"},
		{"spin word small", hw.Command{Program: prog(d0, "spin"), Args: []hw.Arg{hw.BufferArg(a, 0, 0), hw.Uint(0), hw.Uint(1)}}, errdefs.ErrInvalidArgument, "outside a 0-byte range"},
		{"too many args", hw.Command{Program: prog(d0, "noop"), Args: make([]hw.Arg, hw.MaxArgs+1)}, errdefs.ErrInvalidArgument, "at most"},
		{"mlp_forward count", mlp(-1, hw.Arg{}), errdefs.ErrInvalidArgument, "mlp_forward takes 10 argument(s), got 9"},
		{"mlp_forward I=0", mlp(7, hw.Uint(0)), errdefs.ErrInvalidArgument, "I=0 H=3 C=2: want I ≥ 1"},
		{"mlp_forward H=0", mlp(8, hw.Uint(0)), errdefs.ErrInvalidArgument, "I=2 H=0 C=2"},
		{"mlp_forward H wide", mlp(8, hw.Uint(1025)), errdefs.ErrInvalidArgument, "H=1025"},
		{"mlp_forward C wide", mlp(9, hw.Uint(1025)), errdefs.ErrInvalidArgument, "C=1025"},
		{"mlp_forward C u32", mlp(9, hw.Uint(1<<32)), errdefs.ErrInvalidArgument, "argument 9 must be a uint32"},
		{"mlp_forward W1 size", mlp(1, hw.BufferArg(a, 8, 20)), errdefs.ErrInvalidArgument, "argument 1 has 20 bytes, want 2×3"},
		{"mlp_forward b2 size", mlp(4, hw.BufferArg(a, 68, 4)), errdefs.ErrInvalidArgument, "argument 4 has 4 bytes, want 1×2"},
		{"mlp_forward scores size", mlp(5, hw.BufferArg(a, 76, 12)), errdefs.ErrInvalidArgument, "argument 5 has 12 bytes, want 1×2"},
		{"mlp_forward out small", mlp(6, hw.BufferArg(a, 84, 4)), errdefs.ErrInvalidArgument, "argument 6 has 4 bytes, want at least 8"},
		{"mlp_forward scores over x", mlp(5, hw.BufferArg(a, 0, 8)), errdefs.ErrInvalidArgument, "argument 5 (an output) overlaps argument 0"},
		{"mlp_forward out over scores", mlp(6, hw.BufferArg(a, 80, 8)), errdefs.ErrInvalidArgument, "argument 5 (an output) overlaps argument 6"},
		{"mlp_forward out over W2", mlp(6, hw.BufferArg(a, 44, 8)), errdefs.ErrInvalidArgument, "argument 6 (an output) overlaps argument 3"},
		{"mlp_forward scalar for x", mlp(0, hw.Uint(0)), errdefs.ErrInvalidArgument, "argument 0 must be a float32 buffer range"},
		{"mlp_forward buffer for H", mlp(8, all(a)), errdefs.ErrInvalidArgument, "argument 8 must be a uint32 scalar"},
		{"mlp_forward unaligned W2", mlp(3, hw.BufferArg(a, 46, 24)), errdefs.ErrInvalidArgument, "argument 3: range [46,+24) is not 4-byte aligned"},
		{"mlp_forward other device", mlp(2, hw.BufferArg(other, 32, 12)), errdefs.ErrInvalidArgument, "argument 2: buffer belongs to cuda1"},
	}
	if err := d0.prepareLaunch(&hw.Command{Program: prog(d0, "mlp_forward"), Args: mlpArgs}, &launch{}); err != nil {
		t.Errorf("valid mlp_forward: %v", err)
	}
	var l launch
	for _, c := range cases {
		err := d0.prepareLaunch(&c.cmd, &l)
		if !errors.Is(err, c.class) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: err = %v, want %v containing %q", c.name, err, c.class, c.msg)
		}
	}
	// The same checks guard Submit, Write and Read.
	s, err := d0.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if _, err := s.Submit(&cases[5].cmd); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Submit(other device) = %v", err)
	}
	if _, err := s.Write(a, 1020, make([]byte, 8)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Write past end = %v", err)
	}
	if _, err := s.Read(other, 0, make([]byte, 8)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Read other device = %v", err)
	}
	if _, err := s.Write(freed, 0, make([]byte, 8)); !errors.Is(err, errdefs.ErrClosed) {
		t.Errorf("Write freed = %v", err)
	}
}

func TestPackParameters(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	d := p.devices[0]
	a, _ := d.Alloc(4096, 0, nil)
	defer a.Free()
	base := uint64(a.(*buffer).ptr)
	prog := func(name string) hw.Program { pr, _ := d.Prepare(name); return pr }

	var l launch
	cmd := hw.Command{Program: prog("fill"), Args: []hw.Arg{hw.BufferArg(a, 64, 400), hw.Float32(-2.5)}}
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if l.nparams != 3 || l.params[0] != base+64 || l.params[1] != uint64(math.Float32bits(-2.5)) || l.params[2] != 100 {
		t.Errorf("fill params = %v (n=%d)", l.params[:l.nparams], l.nparams)
	}
	if l.block != [3]uint32{256, 1, 1} || l.grid != [3]uint32{1, 1, 1} {
		t.Errorf("fill dims: block %v grid %v", l.block, l.grid)
	}

	cmd = hw.Command{Program: prog("matmul"), Args: []hw.Arg{hw.BufferArg(a, 0, 4*6), hw.BufferArg(a, 1024, 4*12), hw.BufferArg(a, 2048, 4*8),
		hw.Uint(2), hw.Uint(4), hw.Uint(3)}, Grid: [3]uint32{1000, 7, 9}}
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{base, base + 1024, base + 2048, 2, 4, 3}; !reflect.DeepEqual(l.params[:l.nparams], want) {
		t.Errorf("matmul params = %v, want %v", l.params[:l.nparams], want)
	}
	if l.grid != [3]uint32{4, 1, 1} {
		t.Errorf("matmul grid from Grid{1000,7,9} = %v, want {4,1,1} (1-D kernels ignore y, z)", l.grid)
	}

	cmd = hw.Command{Program: prog("spin"), Args: []hw.Arg{hw.BufferArg(a, 8, 64), hw.Uint(12), hw.Uint(2)}}
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{base + 8, 12, 2}; !reflect.DeepEqual(l.params[:l.nparams], want) {
		t.Errorf("spin params = %v, want %v", l.params[:l.nparams], want)
	}
	if l.grid != [3]uint32{1, 1, 1} || l.block != [3]uint32{1, 1, 1} {
		t.Errorf("spin dims: block %v grid %v", l.block, l.grid)
	}

	cmd = hw.Command{Program: prog("argmax"), Args: []hw.Arg{hw.BufferArg(a, 0, 4000), hw.BufferArg(a, 4000, 8)}, Grid: [3]uint32{99999}}
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if l.grid != [3]uint32{1, 1, 1} || l.block != [3]uint32{256, 1, 1} || l.params[2] != 1000 {
		t.Errorf("argmax: grid %v block %v n %d (one block of 256 regardless of Grid)", l.grid, l.block, l.params[2])
	}

	// copy: disjoint ranges run in parallel; overlapping ones on one thread.
	cmd = hw.Command{Program: prog("copy"), Args: []hw.Arg{hw.BufferArg(a, 0, 1000), hw.BufferArg(a, 1000, 1000)}}
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if l.grid != [3]uint32{4, 1, 1} || l.block != [3]uint32{256, 1, 1} {
		t.Errorf("disjoint copy: grid %v block %v", l.grid, l.block)
	}
	cmd.Args[1] = hw.BufferArg(a, 999, 1000)
	if err := d.prepareLaunch(&cmd, &l); err != nil {
		t.Fatal(err)
	}
	if l.grid != [3]uint32{1, 1, 1} || l.block != [3]uint32{1, 1, 1} {
		t.Errorf("overlapping copy: grid %v block %v, want one thread", l.grid, l.block)
	}
	// fill's float scalar keeps the low 32 bits, as hw.Arg.Float32Value does.
	cmd = hw.Command{Program: prog("fill"), Args: []hw.Arg{hw.BufferArg(a, 0, 8), {Value: 1<<40 | uint64(math.Float32bits(3))}}}
	if err := d.prepareLaunch(&cmd, &l); err != nil || l.params[1] != uint64(math.Float32bits(3)) {
		t.Errorf("fill with high scalar bits: %v, %#x", err, l.params[1])
	}
}

func TestLaunchDims(t *testing.T) {
	k := kernelByName["relu"]
	cases := []struct {
		elems uint64
		grid  [3]uint32
		want  uint32
	}{
		{0, [3]uint32{}, 1},
		{1, [3]uint32{}, 1},
		{256, [3]uint32{}, 1},
		{257, [3]uint32{}, 2},
		{1 << 40, [3]uint32{}, maxGridBlocks},
		{10, [3]uint32{math.MaxUint32}, (math.MaxUint32 + 255) / 256},
		{10, [3]uint32{1}, 1},
	}
	for _, c := range cases {
		_, g := launchDims(k, launchShape{elems: c.elems}, c.grid)
		if g[0] != c.want || g[1] != 1 || g[2] != 1 {
			t.Errorf("elems %d grid %v: blocks %v, want %d", c.elems, c.grid, g, c.want)
		}
	}
}

func TestFakeKernels(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	scenarioKernels(t, p)
}

func TestFakeMLPForward(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	scenarioMLPForward(t, p)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kernelsRun["mlp_forward"] != 3*6 || f.kernelsRun["matmul"] != 2*6 {
		t.Errorf("kernels run: %v", f.kernelsRun)
	}
}

func TestFakeMLP(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	scenarioMLP(t, p)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kernelsRun["matmul"] != 2 || f.kernelsRun["argmax"] != 5 {
		t.Errorf("kernels run: %v", f.kernelsRun)
	}
}

func TestFakeSharedSpin(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	t.Logf("store→retire latency on the fake: %v", scenarioSharedSpin(t, p))
}

func TestFakeGraph(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	scenarioGraph(t, p)
}

func TestFakeDeviceLost(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	scenarioLost(t, p)
	if _, err := p.devices[0].Prepare("noop"); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Errorf("Prepare after loss = %v", err)
	}
}

func TestFakeOpenErrors(t *testing.T) {
	if _, err := Open(NewConfig().withDriver(newFake(0))); !errors.Is(err, errdefs.ErrUnsupported) {
		t.Errorf("Open with no device = %v, want ErrUnsupported", err)
	}
	_, err := Open(NewConfig().withDriver(newFake(1)).withPTX([]byte("not ptx")))
	if !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_PTX") {
		t.Errorf("Open with bad PTX = %v, want ErrUnsupported naming CUDA_ERROR_INVALID_PTX", err)
	}
	_, err = Open(NewConfig().withDriver(newFake(1)).withPTX([]byte(".version 7.8\n.target sm_90\n")))
	if !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), `kernel "noop"`) {
		t.Errorf("Open with a module lacking kernels = %v", err)
	}
}

func TestFakePlatformAndDevices(t *testing.T) {
	p, _ := newFakePlatform(t, 2)
	devs := p.Devices()
	if len(devs) != 3 || devs[0].Name() != "cuda0" || devs[1].Name() != "cuda1" || devs[0].Engine() != hw.EngineGPU ||
		devs[2].Name() != "host0" || devs[2].Engine() != hw.EngineCPU || devs[2] != p.Host() {
		t.Fatalf("devices: %v", devs)
	}
	if d, err := p.Device("host0"); err != nil || d != p.Host() {
		t.Fatalf("Device(host0) = %v, %v", d, err)
	}
	if d, err := p.Device("cuda1"); err != nil || d != devs[1] {
		t.Fatalf("Device(cuda1) = %v, %v", d, err)
	}
	if _, err := p.Device("cuda9"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Device(cuda9) = %v", err)
	}
	if _, err := devs[0].Prepare("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare(nope) = %v", err)
	}
	if p.DriverVersion() != 13000 || p.devices[0].Model() != "Fake GPU" {
		t.Fatalf("version %d model %q", p.DriverVersion(), p.devices[0].Model())
	}
}

func TestFakeBudgetAndLifetimes(t *testing.T) {
	p, _ := newFakePlatform(t, 2)
	d := p.devices[0]
	budget := hw.NewBudget("test", 1000)
	b1, err := d.Alloc(600, 0, budget)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(600, 0, budget); !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("over budget: %v", err)
	}
	if _, err := d.Alloc(2<<30, 0, nil); !errors.Is(err, errdefs.ErrOutOfBudget) {
		t.Fatalf("device out of memory: %v", err)
	}
	if _, err := d.Alloc(0, 0, budget); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("zero size: %v", err)
	}
	if _, err := d.Alloc(8, 1<<7, budget); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown flag: %v", err)
	}
	if budget.Used() != 600 {
		t.Fatalf("used %d", budget.Used())
	}
	// Device.Close refuses while the buffer lives.
	if err := d.Close(); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("Close with live buffer: %v", err)
	}
	if err := b1.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b1.Free(); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("double free: %v", err)
	}
	if budget.Used() != 0 {
		t.Fatalf("used %d after free", budget.Used())
	}

	// Shared allocations: views per device, invalid devices refused.
	sh, err := p.AllocShared(128, p.Devices()[:2], budget)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Devices()) != 2 || sh.Size() != 128 {
		t.Fatalf("shared devices %v size %d", sh.Devices(), sh.Size())
	}
	v0, err := sh.View(p.devices[0])
	if err != nil {
		t.Fatal(err)
	}
	if v0.Device() != p.devices[0] || v0.Size() != 128 || v0.Free() != nil {
		t.Fatalf("view: %v %d", v0.Device(), v0.Size())
	}
	other, _ := Open(NewConfig().withDriver(newFake(1)))
	defer other.Close()
	if _, err := sh.View(other.devices[0]); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("View(foreign) = %v", err)
	}
	if _, err := p.AllocShared(64, []hw.Device{other.devices[0]}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("AllocShared(foreign) = %v", err)
	}
	if _, err := sh.PrepareRelease(p.devices[1], 60, 100); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("PrepareRelease past end = %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("unaligned Store32Release did not panic")
			}
		}()
		sh.Store32Release(2, 1)
	}()
	if err := sh.Free(); err != nil {
		t.Fatal(err)
	}
	if err := sh.Free(); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("double shared free = %v", err)
	}
	if _, err := sh.View(p.devices[0]); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("View after Free = %v", err)
	}
	if budget.Used() != 0 {
		t.Fatalf("used %d after shared free", budget.Used())
	}

	// Streams: Close twice, Submit after Close.
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("device Close with live stream: %v", err)
	}
	noop, _ := d.Prepare("noop")
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := s.Submit(&hw.Command{Program: noop}); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Submit after Close = %v", err)
	}
}

func TestFakeCompletionStates(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	r := newRig(t, p)
	b := r.alloc(1024, 0)

	// Hold the device: work stays pending.
	f.gate.Lock()
	c := r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(1))
	time.Sleep(5 * time.Millisecond)
	if c.Done() || c.Err() != nil || r.s.Idle() {
		t.Fatalf("pending: Done=%v Err=%v Idle=%v", c.Done(), c.Err(), r.s.Idle())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := c.Wait(ctx)
	cancel()
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past deadline = %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := r.s.Sync(ctx); !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync with canceled ctx = %v", err)
	}
	// Close with an expired context keeps the stream, closed to new work.
	if err := r.s.Close(ctx); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Close with canceled ctx = %v", err)
	}
	if _, err := r.s.Submit(&hw.Command{Program: r.prog("noop")}); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Submit on closing stream = %v", err)
	}
	f.gate.Unlock()
	if err := c.Wait(r.ctx); err != nil {
		t.Fatalf("Wait after release: %v", err)
	}
	if !c.Done() || !r.s.Idle() {
		t.Fatalf("after wait: Done=%v Idle=%v", c.Done(), r.s.Idle())
	}
	// Zero completion.
	var z hw.Completion
	if !z.Done() || z.Wait(context.Background()) != nil {
		t.Fatal("zero completion")
	}
}

func TestFakeRetiredGoesStaleFree(t *testing.T) {
	// Retired/Done/Idle catch up without anyone waiting (the driver thread
	// keeps polling with a backoff).
	p, _ := newFakePlatform(t, 1)
	r := newRig(t, p)
	c := r.submit("noop", 0)
	testutil.Eventually(t, 2*time.Second, c.Done, "completion never became Done without a waiter")
	if !r.s.Idle() {
		t.Fatal("not Idle after the only command retired")
	}
}

func TestFakeLaunchFailureReportedOnce(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	r := newRig(t, p)
	c1 := r.submit("noop", 0)
	if err := c1.Wait(r.ctx); err != nil {
		t.Fatalf("c1 = %v", err)
	}
	f.mu.Lock()
	f.launchFail = cudaErrorLaunchOutOfResources
	f.mu.Unlock()
	c2 := r.submit("noop", 0)
	c3 := r.submit("noop", 0)
	err := c2.Wait(r.ctx)
	if !errors.Is(err, errdefs.ErrRejected) || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") {
		t.Fatalf("failed launch completion = %v", err)
	}
	if err := c1.Err(); err != nil {
		t.Fatalf("c1 = %v", err)
	}
	if err := c3.Wait(r.ctx); err != nil {
		t.Fatalf("c3 = %v", err)
	}
	if err := r.s.Sync(r.ctx); !errors.Is(err, errdefs.ErrRejected) {
		t.Fatalf("first Sync = %v, want the launch failure", err)
	}
	if err := r.s.Sync(r.ctx); err != nil {
		t.Fatalf("second Sync = %v, want nil (already reported)", err)
	}
	if p.devices[0].Err() != nil {
		t.Fatalf("a rejected launch lost the device: %v", p.devices[0].Err())
	}
}

func TestFakeWriteReadPins(t *testing.T) {
	p, _ := newFakePlatform(t, 1)
	r := newRig(t, p)
	b := r.alloc(64, 0)
	src := []byte("hello, device memory; this is a test of ordered copies")
	r.write(b, 3, src)
	if got := r.read(b, 3, len(src)); string(got) != string(src) {
		t.Fatalf("round trip = %q", got)
	}
	// Empty copies retire in order too.
	c, err := r.s.Write(b, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(r.ctx); err != nil {
		t.Fatal(err)
	}
	if st := r.s.(*Stream); st.pins.len() != 0 {
		t.Fatalf("%d pins held after retirement", st.pins.len())
	}
}

func TestFakeConcurrentSubmitters(t *testing.T) {
	p, _ := newFakePlatform(t, 1, NewConfig().WithQueueDepth(8))
	r := newRig(t, p)
	b := r.alloc(4*64, 0)
	saxpy := r.prog("saxpy")
	x := r.alloc(4*64, 0)
	r.submit("fill", 0, hw.BufferArg(x, 0, -1), hw.Float32(1))
	done := make(chan error)
	var busy atomic.Int64
	for range 8 {
		go func() {
			for i := 0; i < 50; {
				_, err := r.s.Submit(&hw.Command{Program: saxpy, Args: []hw.Arg{hw.Float32(1), hw.BufferArg(x, 0, -1), hw.BufferArg(b, 0, -1)}})
				switch {
				case errors.Is(err, errdefs.ErrBusy): // queue full: retry
					busy.Add(1)
					runtime.Gosched()
				case err != nil:
					done <- err
					return
				default:
					i++
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d submissions found the 8-deep queue full (ErrBusy)", busy.Load())
	r.sync() // the last submissions may still fill the queue the read needs
	for i, v := range r.download(b) {
		if v != 400 {
			t.Fatalf("b[%d] = %v, want 400", i, v)
		}
	}
}

func TestSubmitAllocatesNothing(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithQueueDepth(4096))
	r := newRig(t, p)
	b := r.alloc(1024, 0)
	cmd := &hw.Command{Program: r.prog("fill"), Args: []hw.Arg{hw.BufferArg(b, 0, -1), hw.Float32(1)}}
	r.submit("noop", 0)
	r.sync()
	// Park the driver thread inside its first launch so only the
	// submitting goroutine allocates (or not).
	release := parkDriverThread(t, f, r)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.s.Submit(cmd); err != nil {
			t.Fatal(err)
		}
	})
	release()
	r.sync()
	if allocs != 0 {
		t.Fatalf("Submit allocates %v times per call", allocs)
	}
}

func TestFakeQueueFullIsBusy(t *testing.T) {
	p, f := newFakePlatform(t, 1, NewConfig().WithQueueDepth(2))
	r := newRig(t, p)
	noop := &hw.Command{Program: r.prog("noop")}
	f.launchGate.Lock() // the driver thread parks in its first launch
	var busy error
	for range 10 {
		if _, err := r.s.Submit(noop); err != nil {
			busy = err
			break
		}
	}
	f.launchGate.Unlock()
	if !errors.Is(busy, errdefs.ErrBusy) {
		t.Fatalf("submitting past the queue depth: %v, want ErrBusy", busy)
	}
	r.sync()
}

// TestFakeFreeWaitsForQueuedWork: a buffer freed while queued commands use
// it is released only after they retire; later commands cannot use it.
func TestFakeFreeWaitsForQueuedWork(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	r := newRig(t, p)
	budget := hw.NewBudget("b", 0)
	b, err := r.dev.Alloc(4096, 0, budget)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := p.AllocShared(64, p.Devices(), budget)
	if err != nil {
		t.Fatal(err)
	}
	view, _ := sh.View(r.dev)
	f.gate.Lock() // hold the device
	c := r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(1))
	r.submit("fill", 0, hw.BufferArg(view, 0, -1), hw.Float32(2))
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := sh.Free(); err != nil {
		t.Fatal(err)
	}
	if budget.Used() != 4096+64 {
		t.Fatalf("budget %d released while queued work still uses the memory", budget.Used())
	}
	if _, err := r.s.Submit(&hw.Command{Program: r.prog("relu"), Args: []hw.Arg{hw.BufferArg(b, 0, -1)}}); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Submit with a freed buffer = %v", err)
	}
	if _, err := r.s.Write(view, 0, make([]byte, 4)); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("Write to a freed shared view = %v", err)
	}
	if err := p.devices[0].Close(); !errors.Is(err, errdefs.ErrBusy) {
		t.Fatalf("device Close with a pending free = %v", err)
	}
	f.gate.Unlock()
	if err := c.Wait(r.ctx); err != nil {
		t.Fatal(err)
	}
	if !testutil.Poll(2*time.Second, func() bool { return budget.Used() == 0 }) {
		t.Fatalf("budget still %d after the work retired", budget.Used())
	}
}

// checkOpEntries checks the op library's entries: the parameter types each
// declares (kernels.cu), and that pack yields that many parameters for
// every program of the library.
func checkOpEntries(t *testing.T, decl map[string][]string) {
	t.Helper()
	rep := func(ty string, n int) []string {
		var s []string
		for range n {
			s = append(s, ty)
		}
		return s
	}
	cat := func(parts ...[]string) []string {
		var s []string
		for _, p := range parts {
			s = append(s, p...)
		}
		return s
	}
	want := map[string][]string{
		"permute_b32": rep("u64", 10), "permute_b16": rep("u64", 10),
		"gather_b32": rep("u64", 6),
		"conv2d_f32": cat(rep("u64", 4), rep("u32", 7), rep("u64", 3), rep("u32", 3)),
		"pool2d_f32": cat(rep("u64", 2), rep("u32", 6), rep("u64", 2), rep("u32", 3)),
		"cast":       cat(rep("u64", 3), rep("u32", 2)),
	}
	for _, suf := range []string{"f32", "f16", "bf16"} {
		want["unary_"+suf] = cat(rep("u64", 3), rep("u32", 1))
		want["affine_"+suf] = cat(rep("u64", 3), rep("f32", 2))
		want["binary_"+suf] = cat(rep("u64", 3), rep("u32", 1), rep("u64", 12))
		want["reduce_"+suf] = cat(rep("u64", 5), rep("u32", 1))
		want["softmax_"+suf] = cat(rep("u64", 5), rep("u32", 1))
		want["layernorm_"+suf] = cat(rep("u64", 6), rep("f32", 1))
		want["rmsnorm_"+suf] = cat(rep("u64", 5), rep("f32", 1))
		want["gemm_"+suf] = cat(rep("u64", 3), rep("u32", 5), rep("f32", 2), rep("u32", 1), rep("u64", 3))
	}
	for _, k := range kernels {
		if k.op == nil {
			continue
		}
		got, ok := decl[k.entry]
		if !ok {
			t.Errorf("%s: PTX lacks entry %s", k.name, k.entry)
			continue
		}
		if !reflect.DeepEqual(got, want[k.entry]) {
			t.Errorf("%s: PTX parameters %v, want %v", k.entry, got, want[k.entry])
		}
		var a [hw.MaxArgs]resolved
		for i, ai := range k.op.Info().Args {
			// Plausible values: strides and pads (1, 1), an identity
			// permutation, dtype f32, no causal mask.
			v := uint64(1)
			switch {
			case ai.Type == "u64":
				v = 1 | 1<<32
			case len(ai.Name) == 2 && ai.Name[0] == 'p':
				v = uint64(ai.Name[1] - '0')
			case ai.Name == "from" || ai.Name == "to" || ai.Name == "causal":
				v = 0
			}
			a[i] = resolved{isBuf: true, ptr: 0x10000 * uint64(i+1), len: 4, val: v}
		}
		var p [maxParams]uint64
		n, _, err := pack(k, a[:len(k.op.Info().Args)], &p)
		if err != nil {
			t.Errorf("%s: pack: %v", k.name, err)
			continue
		}
		if n != len(want[k.entry]) {
			t.Errorf("%s: pack produced %d parameters, %s declares %d", k.name, n, k.entry, len(want[k.entry]))
		}
	}
}

// Per-row op kernels launch a warp per row of at most warpRowCols values
// (8 rows per block), a block per longer row.
func TestRowOpLaunchShape(t *testing.T) {
	cases := []struct {
		prog       string
		args       []resolved
		wantBlocks uint32
	}{
		{"softmax", []resolved{{}, {}, {val: 64}, {val: 1024}, {val: 0}}, 8},
		{"log_softmax", []resolved{{}, {}, {val: 65}, {val: 37}, {val: 0}}, 9},
		{"softmax", []resolved{{}, {}, {val: 64}, {val: 1025}, {val: 0}}, 64},
		{"layernorm", []resolved{{}, {}, {}, {}, {val: 16}, {val: 512}, {}}, 2},
		{"layernorm", []resolved{{}, {}, {}, {}, {val: 16}, {val: 3000}, {}}, 16},
		{"rmsnorm", []resolved{{}, {}, {}, {val: 24}, {val: 1024}, {}}, 3},
		{"rmsnorm", []resolved{{}, {}, {}, {val: 24}, {val: 2048}, {}}, 24},
	}
	for _, c := range cases {
		k := kernelByName[c.prog]
		if k == nil {
			t.Fatalf("no kernel %q", c.prog)
		}
		var p [maxParams]uint64
		_, shape := packOp(k, c.args, &p)
		_, g := launchDims(k, shape, [3]uint32{})
		if g[0] != c.wantBlocks {
			t.Errorf("%s %v: %d blocks, want %d", c.prog, c.args, g[0], c.wantBlocks)
		}
	}
}
