package block

// The block on a real NVIDIA GPU (cuda0): the committed module through a
// stage session, and the same launches submitted from Go through hw/cuda
// directly (no Wasm). Both skip without a usable GPU, unless
// STAGEHOST_REQUIRE_GPU=1. Built with -tags block128 the shape is
// S = 128, D = 512, H = 8 and the module transformer128.wasm.

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stagehost/stagehost/examples/wasm/internal/simrun"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/testutil"
)

// module is the stage module of this build's shape, or the file that
// STAGEHOST_BLOCK_MODULE names (to compare builds of the stage in one run).
func module() string {
	if m := os.Getenv("STAGEHOST_BLOCK_MODULE"); m != "" {
		return m
	}
	if S == 8 {
		return "../stage/transformer.wasm"
	}
	return "../stage/transformer128.wasm"
}

func openGPU(t testing.TB) hw.Device {
	t.Helper()
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	t.Cleanup(func() { p.Close() })
	return p.Devices()[0]
}

// tn is a float32 tensor in a device buffer (offset in values), as the
// guest SDK's Tensor.
type tn struct {
	b    hw.Buffer
	off  int
	dims []int
}

func (x tn) len() int {
	n := 1
	for _, d := range x.dims {
		n *= d
	}
	return n
}

func (x tn) arg() hw.Arg                       { return hw.BufferArg(x.b, 4*x.off, 4*x.len()) }
func (x tn) reshape(dims ...int) tn            { return tn{x.b, x.off, dims} }
func u(v int) hw.Arg                           { return hw.Uint(uint64(v)) }
func dims4(d []int) (s [4]int)                 { s = [4]int{1, 1, 1, 1}; copy(s[4-len(d):], d); return s }
func cmd(p hw.Program, a ...hw.Arg) hw.Command { return hw.Command{Program: p, Args: a} }

// direct returns a function that runs the block as the stage does (the
// same programs, arguments and buffer layout, one batch between an
// upload and a download) from Go through hw/cuda.
func direct(t testing.TB, dev hw.Device) func(in []byte) ([]byte, error) {
	t.Helper()
	prog := map[string]hw.Program{}
	for _, name := range Programs {
		p, err := dev.Prepare(name)
		if err != nil {
			t.Fatal(err)
		}
		prog[name] = p
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	params, err := dev.Alloc(4*nParams, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	work, err := dev.Alloc(4*nWork, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close(context.Background())
		params.Free()
		work.Free()
	})
	if _, err := s.Write(params, 0, stagehost.Float32Bytes(Params())); err != nil {
		t.Fatal(err)
	}
	p := func(off int, dims ...int) tn { return tn{params, off, dims} }
	w := func(off int, dims ...int) tn { return tn{work, off, dims} }
	x, ln1, qkv := w(wX, S, D), w(wLn1, S, D), w(wQKV, S, 3*D)
	q, k, v := w(wQKVT, H, S, Dh), w(wQKVT+S*D, H, S, Dh), w(wQKVT+2*S*D, H, S, Dh)
	scores, attn, attnT := w(wScore, H, S, S), w(wAttn, H, S, Dh), w(wAttnT, S, D)
	proj, h, ln2 := w(wProj, S, D), w(wH, S, D), w(wLn2, S, D)
	m1, m2, out := w(wM1, S, F), w(wM2, S, D), w(wOut, S, D)
	layernorm := func(x, g, b, y tn) hw.Command {
		return cmd(prog["layernorm"], x.arg(), g.arg(), b.arg(), y.arg(), u(x.len()/x.dims[len(x.dims)-1]), u(x.dims[len(x.dims)-1]), hw.Float32(Eps))
	}
	gemm := func(a, b, c tn, transB bool) hw.Command {
		mat := func(x tn) (int, int, int) {
			if len(x.dims) == 2 {
				return 1, x.dims[0], x.dims[1]
			}
			return x.dims[0], x.dims[1], x.dims[2]
		}
		ba, _, ac := mat(a)
		bb, _, _ := mat(b)
		bc, m, n := mat(c)
		stride := func(x tn, batch int) int {
			if len(x.dims) == 2 || batch == 1 && bc > 1 {
				return 0
			}
			return x.dims[1] * x.dims[2]
		}
		tb := 0
		if transB {
			tb = 1
		}
		return cmd(prog["gemm"], a.arg(), b.arg(), c.arg(), u(m), u(n), u(ac), u(0), u(tb), hw.Float32(1), hw.Float32(0),
			u(bc), u(stride(a, ba)), u(stride(b, bb)), u(stride(c, bc)))
	}
	transpose := func(x, y tn, perm ...int) hw.Command {
		d := dims4(x.dims)
		kk := 4 - len(perm)
		pp := [4]int{0, 1, 2, 3}
		for i, v := range perm {
			pp[kk+i] = v + kk
		}
		return cmd(prog["transpose"], x.arg(), y.arg(), u(d[0]), u(d[1]), u(d[2]), u(d[3]), u(pp[0]), u(pp[1]), u(pp[2]), u(pp[3]))
	}
	add := func(a, b, c tn) hw.Command {
		as, bs := dims4(a.dims), dims4(b.dims)
		args := []hw.Arg{a.arg(), b.arg(), c.arg()}
		for _, d := range as {
			args = append(args, u(d))
		}
		for _, d := range bs {
			args = append(args, u(d))
		}
		return cmd(prog["add"], args...)
	}
	layer := []hw.Command{
		layernorm(x, p(offG1, D), p(offB1, D), ln1),
		gemm(ln1, p(offWqkv, D, 3*D), qkv, false),
		transpose(qkv.reshape(S, 3, H, Dh), w(wQKVT, 3, H, S, Dh), 1, 2, 0, 3),
		gemm(q, k, scores, true),
		cmd(prog["affine"], scores.arg(), scores.arg(), hw.Float32(float32(1/math.Sqrt(Dh))), hw.Float32(0)),
		cmd(prog["softmax"], scores.arg(), scores.arg(), u(H*S), u(S), u(S)),
		gemm(scores, v, attn, false),
		transpose(attn, attnT.reshape(S, H, Dh), 1, 0, 2),
		gemm(attnT, p(offWo, D, D), proj, false),
		add(x, proj, h),
		layernorm(h, p(offG2, D), p(offB2, D), ln2),
		gemm(ln2, p(offW1, D, F), m1, false),
		add(m1, p(offC1, F), m1),
		cmd(prog["gelu_tanh"], m1.arg(), m1.arg()),
		gemm(m1, p(offW2, F, D), m2, false),
		add(m2, p(offC2, D), m2),
		add(h, m2, out),
	}
	bs := s.(hw.BatchSubmitter)
	return func(in []byte) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if len(in) != InputSize {
			return nil, &inputError{len(in)}
		}
		o := make([]byte, InputSize)
		if _, err := s.Write(work, 4*wX, in); err != nil {
			return nil, err
		}
		if _, err := bs.SubmitBatch(layer); err != nil {
			return nil, err
		}
		if _, err := s.Read(work, 4*wOut, o); err != nil {
			return nil, err
		}
		return o, s.Sync(ctx)
	}
}

// The module on cuda0 stays within the float64 reference's bound (S = 8
// only: the reference covers that shape), and the same launches from Go
// give the same bytes as the module on cuda0 (any shape).
func TestBlockOnCUDA(t *testing.T) {
	dev := openGPU(t)
	stage := simrun.OpenOn(t, module(), Programs, dev)
	run := direct(t, dev)
	var inputs [][]byte
	for i := range 4 {
		inputs = append(inputs, stagehost.Float32Bytes(Values(uint32(1000+i), S*D, 2)))
	}
	var expected []float64
	if S == 8 {
		ex, err := os.ReadFile("testdata/expected.bin")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(ex); i += 8 {
			expected = append(expected, math.Float64frombits(binary.LittleEndian.Uint64(ex[i:])))
		}
	}
	worst := 0.0
	for i, in := range inputs {
		got, err := stage(in)
		if err != nil {
			t.Fatalf("input %d, module on cuda0: %v", i, err)
		}
		dg, err := run(in)
		if err != nil {
			t.Fatalf("input %d, from Go: %v", i, err)
		}
		if !bytes.Equal(got, dg) {
			t.Errorf("input %d: the module's output on cuda0 differs from the same launches from Go", i)
		}
		if i*S*D >= len(expected) {
			continue
		}
		for j, g := range stagehost.Float32s(got) {
			want := expected[i*S*D+j]
			e := math.Abs(float64(g)-want) / (1 + math.Abs(want))
			worst = max(worst, e)
			if !(e <= 1e-5) {
				t.Errorf("input %d value %d: %g, reference %g", i, j, g, want)
			}
		}
	}
	t.Logf("S=%d D=%d H=%d: largest error against the float64 reference %.3g (checked when S = 8)", S, D, H, worst)
}

// BenchmarkBlockCUDA: one block per call on cuda0, through the module
// (wasm: the stage call, upload, the batch of 17 launches, download, sync,
// fence) and from Go through hw/cuda (go: upload, the same batch,
// download, sync); ns/call-p50 and ns/call-p90 besides the mean. Run with
// -tags block128 for the S = 128, D = 512 block.
func BenchmarkBlockCUDA(b *testing.B) { benchBlock(b, openGPU(b)) }

// BenchmarkBlockSim is BenchmarkBlockCUDA on the simulator: the two
// paths' difference is the host's own cost (the simulated kernels are the
// same work on both).
func BenchmarkBlockSim(b *testing.B) {
	p := sim.New()
	b.Cleanup(func() { p.Close() })
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		b.Fatal(err)
	}
	benchBlock(b, dev)
}

// noopDevice is a sim device whose programs all do nothing (sim's
// "noop"): a call then costs only the host's work (copies, checks,
// submission, waits), which is what sets the module's path apart from
// Go's.
type noopDevice struct{ hw.Device }

func (d noopDevice) Prepare(string) (hw.Program, error) { return d.Device.Prepare("noop") }

// BenchmarkBlockHost is BenchmarkBlockSim with every launch a no-op: the
// host's own cost per call, on each path.
func BenchmarkBlockHost(b *testing.B) {
	p := sim.New()
	b.Cleanup(func() { p.Close() })
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		b.Fatal(err)
	}
	benchBlock(b, noopDevice{dev})
}

// stamps are the moments of one call's device operations, taken by a
// timedDevice: when the batch was handed over, and when the first Sync
// after the download returned (the stage's own Sync, or the Go path's).
type stamps struct {
	batch, read, done time.Time
}

// timedDevice wraps a device so that its streams note, in st, when a call
// handed over its batch and when its download was known to be done: the
// phases of a call are then the host's work before the batch (pre), the
// wait for the device (wait) and the host's work after it (post).
type timedDevice struct {
	hw.Device
	st *stamps
}

func (d timedDevice) NewStream() (hw.Stream, error) {
	s, err := d.Device.NewStream()
	if err != nil {
		return nil, err
	}
	return timedStream{s, s.(hw.BatchSubmitter), d.st}, nil
}

type timedStream struct {
	hw.Stream
	bs hw.BatchSubmitter
	st *stamps
}

func (s timedStream) SubmitBatch(cmds []hw.Command) (hw.Completion, error) {
	c, err := s.bs.SubmitBatch(cmds)
	s.st.batch = time.Now()
	return c, err
}

func (s timedStream) Read(b hw.Buffer, off int, dst []byte) (hw.Completion, error) {
	s.st.read = time.Now()
	return s.Stream.Read(b, off, dst)
}

func (s timedStream) Sync(ctx context.Context) error {
	err := s.Stream.Sync(ctx)
	if s.st.done.IsZero() && !s.st.read.IsZero() {
		s.st.done = time.Now()
	}
	return err
}

func benchBlock(b *testing.B, dev hw.Device) {
	in := stagehost.Float32Bytes(Values(1000, S*D, 2))
	st := new(stamps)
	dev = timedDevice{dev, st}
	for _, c := range []struct {
		name string
		open func(testing.TB) func([]byte) ([]byte, error)
	}{
		{"wasm", func(t testing.TB) func([]byte) ([]byte, error) { return simrun.OpenOn(t, module(), Programs, dev) }},
		{"go", func(t testing.TB) func([]byte) ([]byte, error) { return direct(t, dev) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			call := c.open(b)
			if _, err := call(in); err != nil { // warm-up
				b.Fatal(err)
			}
			var d, pre, wait, post []time.Duration
			for b.Loop() {
				*st = stamps{}
				t0 := time.Now()
				if _, err := call(in); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				d = append(d, t1.Sub(t0))
				pre = append(pre, st.batch.Sub(t0))
				wait = append(wait, st.done.Sub(st.batch))
				post = append(post, t1.Sub(st.done))
			}
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Nanoseconds())
			}
			b.ReportMetric(p50(d), "ns/call-p50")
			slices.Sort(d)
			b.ReportMetric(float64(d[len(d)*9/10].Nanoseconds()), "ns/call-p90")
			b.ReportMetric(p50(pre), "ns/pre-p50")
			b.ReportMetric(p50(wait), "ns/wait-p50")
			b.ReportMetric(p50(post), "ns/post-p50")
		})
	}
}

// The launches from Go (direct) are the module's: on the simulator both
// give the same bytes.
func TestDirectMatchesModuleOnSim(t *testing.T) {
	p := sim.New()
	t.Cleanup(func() { p.Close() })
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	stage := simrun.OpenOn(t, module(), Programs, dev)
	run := direct(t, dev)
	for i := range 2 {
		in := stagehost.Float32Bytes(Values(uint32(2000+i), S*D, 2))
		got, err := stage(in)
		if err != nil {
			t.Fatal(err)
		}
		dg, err := run(in)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, dg) {
			t.Fatalf("input %d: the module's output differs from the same launches from Go", i)
		}
	}
}
