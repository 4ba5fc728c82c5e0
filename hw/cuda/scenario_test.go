package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Pure-Go references of the kernels.

// refMatmul rounds each product before adding it (the explicit
// conversion forbids a fused multiply-add), as the kernel does.
func refMatmul(a, b []float32, m, n, k int) []float32 {
	c := make([]float32, m*n)
	for i := range m {
		for j := range n {
			var acc float32
			for x := range k {
				acc += float32(a[i*k+x] * b[x*n+j])
			}
			c[i*n+j] = acc
		}
	}
	return c
}

func refBias(x, b []float32, m, n int) {
	for i := range m {
		for j := range n {
			x[i*n+j] += b[j]
		}
	}
}

func refRelu(x []float32) {
	for i, v := range x {
		if v < 0 {
			x[i] = 0
		}
	}
}

// refArgmax is the simulator's scan: start with x[0], move to every later
// element strictly greater than the best so far (NaN never is).
func refArgmax(x []float32) (uint32, float32) {
	best, bv := 0, x[0]
	for i, v := range x[1:] {
		if v > bv {
			best, bv = i+1, v
		}
	}
	return uint32(best), bv
}

// refMLPForward is mlp_forward on one row: matmul, bias, relu, matmul,
// bias, argmax, as six separate reference steps. It returns the scores
// and argmax's index and value.
func refMLPForward(x, w1, b1, w2, b2 []float32) ([]float32, uint32, float32) {
	in, hid, cls := len(x), len(b1), len(b2)
	h := refMatmul(x, w1, 1, hid, in)
	refBias(h, b1, 1, hid)
	refRelu(h)
	s := refMatmul(h, w2, 1, cls, hid)
	refBias(s, b2, 1, cls)
	i, v := refArgmax(s)
	return s, i, v
}

// Helpers.

func f32bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type rig struct {
	t   testing.TB
	ctx context.Context
	dev hw.Device
	s   hw.Stream
}

func newRig(t testing.TB, p *Platform) *rig {
	t.Helper()
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	r := &rig{t: t, ctx: testCtx(t), dev: dev, s: s}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil && !errors.Is(err, errdefs.ErrClosed) && dev.Err() == nil {
			t.Errorf("stream Close: %v", err)
		}
	})
	return r
}

func (r *rig) alloc(n int, flags hw.AllocFlags) hw.Buffer {
	r.t.Helper()
	b, err := r.dev.Alloc(n, flags, nil)
	if err != nil {
		r.t.Fatalf("Alloc(%d): %v", n, err)
	}
	r.t.Cleanup(func() { b.Free() })
	return b
}

func (r *rig) upload(x []float32) hw.Buffer {
	r.t.Helper()
	b := r.alloc(4*len(x), 0)
	r.write(b, 0, f32bytes(x))
	return b
}

func (r *rig) write(b hw.Buffer, off int, src []byte) {
	r.t.Helper()
	if _, err := r.s.Write(b, off, src); err != nil {
		r.t.Fatalf("Write: %v", err)
	}
}

func (r *rig) read(b hw.Buffer, off, n int) []byte {
	r.t.Helper()
	dst := make([]byte, n)
	c, err := r.s.Read(b, off, dst)
	if err != nil {
		r.t.Fatalf("Read: %v", err)
	}
	if err := c.Wait(r.ctx); err != nil {
		r.t.Fatalf("Read wait: %v", err)
	}
	return dst
}

func (r *rig) download(b hw.Buffer) []float32 { return bytesF32(r.read(b, 0, b.Size())) }

func (r *rig) prog(name string) hw.Program {
	r.t.Helper()
	p, err := r.dev.Prepare(name)
	if err != nil {
		r.t.Fatalf("Prepare(%s): %v", name, err)
	}
	return p
}

func (r *rig) submit(name string, grid uint32, args ...hw.Arg) hw.Completion {
	r.t.Helper()
	c, err := r.s.Submit(&hw.Command{Program: r.prog(name), Args: args, Grid: [3]uint32{grid}})
	if err != nil {
		r.t.Fatalf("Submit(%s): %v", name, err)
	}
	return c
}

func (r *rig) sync() {
	r.t.Helper()
	if err := r.s.Sync(r.ctx); err != nil {
		r.t.Fatalf("Sync: %v", err)
	}
}

func near(a, b float32) bool {
	d := math.Abs(float64(a - b))
	return d <= 1e-4*math.Max(1, math.Max(math.Abs(float64(a)), math.Abs(float64(b))))
}

func assertNear(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !near(got[i], want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// assertBits fails unless got and want hold the same float32 values bit
// for bit (any NaN matches any NaN: the GPU's are canonical).
func assertBits(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !sameBits(got[i], want[i]) {
			t.Fatalf("%s[%d] = %v (%#x), want %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// scenarioKernels checks every kernel against its CPU reference.
func scenarioKernels(t *testing.T, p *Platform) {
	r := newRig(t, p)
	rnd := rand.New(rand.NewPCG(1, 2))

	t.Run("noop", func(t *testing.T) {
		if err := r.submit("noop", 0).Wait(r.ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("zeroed", func(t *testing.T) {
		for _, flags := range []hw.AllocFlags{0, hw.AllocHostVisible} {
			b := r.alloc(1000, flags)
			for i, v := range r.read(b, 0, 1000) {
				if v != 0 {
					t.Fatalf("flags %d: fresh buffer byte %d = %#x", flags, i, v)
				}
			}
		}
	})
	t.Run("fill", func(t *testing.T) {
		b := r.alloc(4*1000, 0)
		// Fill the middle range [100, 900) elements; a tiny grid exercises the grid-stride loop.
		r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(-1))
		r.submit("fill", 64, hw.BufferArg(b, 400, 3200), hw.Float32(2.5))
		got := r.download(b)
		for i, v := range got {
			want := float32(-1)
			if i >= 100 && i < 900 {
				want = 2.5
			}
			if v != want {
				t.Fatalf("fill[%d] = %v, want %v", i, v, want)
			}
		}
	})
	t.Run("copy", func(t *testing.T) {
		src := make([]byte, 777)
		for i := range src {
			src[i] = byte(i * 7)
		}
		a, b := r.alloc(777, 0), r.alloc(800, 0)
		r.write(a, 0, src)
		r.submit("copy", 0, hw.BufferArg(b, 3, 500), hw.BufferArg(a, 1, 500)) // a[1:501] → b[3:503]
		got := r.read(b, 0, 800)
		for i, v := range got {
			want := byte(0)
			if i >= 3 && i < 503 {
				want = src[i-3+1]
			}
			if v != want {
				t.Fatalf("copy[%d] = %d, want %d", i, v, want)
			}
		}
		// Overlapping ranges copy like memmove, in both directions.
		want := append([]byte(nil), src...)
		copy(want[10:410], want[0:400])
		r.submit("copy", 0, hw.BufferArg(a, 10, 400), hw.BufferArg(a, 0, 400))
		copy(want[5:605], want[20:620])
		r.submit("copy", 0, hw.BufferArg(a, 5, 600), hw.BufferArg(a, 20, 600))
		if got := r.read(a, 0, 777); string(got) != string(want) {
			t.Fatalf("overlapping copies differ from memmove")
		}
	})
	t.Run("saxpy", func(t *testing.T) {
		x, y := randF32(rnd, 5000), randF32(rnd, 5000)
		bx, by := r.upload(x), r.upload(y)
		r.submit("saxpy", 0, hw.Float32(0.75), hw.BufferArg(bx, 0, -1), hw.BufferArg(by, 0, -1))
		want := make([]float32, len(y))
		for i := range y {
			want[i] = float32(0.75*x[i]) + y[i]
		}
		assertBits(t, "saxpy", r.download(by), want)
	})
	t.Run("matmul", func(t *testing.T) {
		for _, sz := range [][3]int{{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 64, 64}} {
			m, n, k := sz[0], sz[1], sz[2]
			a, b := randF32(rnd, m*k), randF32(rnd, k*n)
			ba, bb, bc := r.upload(a), r.upload(b), r.alloc(4*m*n, 0)
			r.submit("matmul", uint32(n), hw.BufferArg(ba, 0, -1), hw.BufferArg(bb, 0, -1), hw.BufferArg(bc, 0, -1),
				hw.Uint(uint64(m)), hw.Uint(uint64(n)), hw.Uint(uint64(k)))
			assertBits(t, "matmul", r.download(bc), refMatmul(a, b, m, n, k))
		}
	})
	t.Run("bias", func(t *testing.T) {
		m, n := 9, 13
		x, b := randF32(rnd, m*n), randF32(rnd, n)
		bx, bb := r.upload(x), r.upload(b)
		r.submit("bias", 0, hw.BufferArg(bx, 0, -1), hw.BufferArg(bb, 0, -1), hw.Uint(uint64(m)), hw.Uint(uint64(n)))
		refBias(x, b, m, n)
		assertNear(t, "bias", r.download(bx), x)
	})
	t.Run("relu", func(t *testing.T) {
		x := randF32(rnd, 3001)
		x[7], x[8], x[9] = float32(math.Copysign(0, -1)), float32(math.NaN()), -1
		bx := r.upload(x)
		r.submit("relu", 0, hw.BufferArg(bx, 0, -1))
		refRelu(x)
		got := r.download(bx)
		if math.Float32bits(got[7]) != math.Float32bits(x[7]) || !math.IsNaN(float64(got[8])) || got[9] != 0 {
			t.Fatalf("relu(-0, NaN, -1) = %v, %v, %v; want -0, NaN, 0", got[7], got[8], got[9])
		}
		got[8], x[8] = 0, 0
		assertNear(t, "relu", got, x)
	})
	t.Run("argmax", func(t *testing.T) {
		inf, nan := float32(math.Inf(1)), float32(math.NaN())
		cases := [][]float32{
			randF32(rnd, 10000),
			{3, 1, 3, 2},                    // tie: first index
			{-5, -4, -4.5},                  // all negative
			{-inf, -inf, -inf},              // all -Inf
			{1},                             // one element
			append(make([]float32, 300), 1), // max at the end, beyond one thread's first element
			{nan, 5, 7},                     // NaN first: nothing compares greater
			{-inf, nan, -5, nan},            // later NaNs never win
			{nan, nan},
		}
		for ci, x := range cases {
			bx := r.alloc(4*len(x)+4, 0)
			r.write(bx, 0, f32bytes(x))
			out := r.alloc(16, 0)
			// An unaligned out range: the kernel stores bytes.
			r.submit("argmax", 0, hw.BufferArg(bx, 0, 4*len(x)), hw.BufferArg(out, 3, 8))
			got := r.read(out, 3, 8)
			idx, v := binary.LittleEndian.Uint32(got), math.Float32frombits(binary.LittleEndian.Uint32(got[4:]))
			wi, wv := refArgmax(x)
			if idx != wi || math.Float32bits(v) != math.Float32bits(wv) && !(v != v && wv != wv) {
				t.Fatalf("case %d: argmax = (%d, %v), want (%d, %v)", ci, idx, v, wi, wv)
			}
		}
	})
	t.Run("host-visible", func(t *testing.T) {
		b := r.alloc(4*256, hw.AllocHostVisible)
		hb, err := b.HostBytes()
		if err != nil {
			t.Fatal(err)
		}
		copy(hb, f32bytes(make([]float32, 256)))
		if err := r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(4)).Wait(r.ctx); err != nil {
			t.Fatal(err)
		}
		for i, v := range bytesF32(hb) {
			if v != 4 {
				t.Fatalf("host view [%d] = %v after fill", i, v)
			}
		}
		dev := r.alloc(16, 0)
		if _, err := dev.HostBytes(); !errors.Is(err, errdefs.ErrUnsupported) {
			t.Fatalf("device buffer HostBytes: %v, want ErrUnsupported", err)
		}
	})
	if !r.s.Idle() {
		// Everything was waited for through reads; the last Sync settles it.
		r.sync()
	}
}

// mlp is the test network: logits = relu(x·W1 + b1)·W2 + b2, batch rows.
type mlp struct {
	batch, in, hidden, out int
	x, w1, b1, w2, b2      []float32
}

func newMLP(seed uint64) *mlp {
	r := rand.New(rand.NewPCG(seed, 7))
	m := &mlp{batch: 5, in: 24, hidden: 32, out: 10}
	m.x, m.w1, m.b1 = randF32(r, m.batch*m.in), randF32(r, m.in*m.hidden), randF32(r, m.hidden)
	m.w2, m.b2 = randF32(r, m.hidden*m.out), randF32(r, m.out)
	return m
}

func (m *mlp) reference() (logits []float32, classes []uint32) {
	h := refMatmul(m.x, m.w1, m.batch, m.hidden, m.in)
	refBias(h, m.b1, m.batch, m.hidden)
	refRelu(h)
	logits = refMatmul(h, m.w2, m.batch, m.out, m.hidden)
	refBias(logits, m.b2, m.batch, m.out)
	for i := range m.batch {
		c, _ := refArgmax(logits[i*m.out : (i+1)*m.out])
		classes = append(classes, c)
	}
	return logits, classes
}

// scenarioMLP runs matmul→bias→relu→matmul→bias→argmax (per row, through
// buffer offsets) and compares with the pure-Go network.
func scenarioMLP(t *testing.T, p *Platform) {
	r := newRig(t, p)
	m := newMLP(42)
	x, w1, b1, w2, b2 := r.upload(m.x), r.upload(m.w1), r.upload(m.b1), r.upload(m.w2), r.upload(m.b2)
	h, logits, out := r.alloc(4*m.batch*m.hidden, 0), r.alloc(4*m.batch*m.out, 0), r.alloc(8*m.batch, 0)
	all := func(b hw.Buffer) hw.Arg { return hw.BufferArg(b, 0, -1) }
	u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
	r.submit("matmul", 0, all(x), all(w1), all(h), u(m.batch), u(m.hidden), u(m.in))
	r.submit("bias", 0, all(h), all(b1), u(m.batch), u(m.hidden))
	r.submit("relu", 0, all(h))
	r.submit("matmul", 0, all(h), all(w2), all(logits), u(m.batch), u(m.out), u(m.hidden))
	r.submit("bias", 0, all(logits), all(b2), u(m.batch), u(m.out))
	for i := range m.batch {
		r.submit("argmax", 0, hw.BufferArg(logits, 4*m.out*i, 4*m.out), hw.BufferArg(out, 8*i, 8))
	}
	gotLogits := r.download(logits)
	gotOut := r.read(out, 0, 8*m.batch)
	wantLogits, wantClasses := m.reference()
	assertBits(t, "logits", gotLogits, wantLogits)
	for i := range m.batch {
		got := binary.LittleEndian.Uint32(gotOut[8*i:])
		// The device's own logits decide near-ties; they match the
		// reference within tolerance (checked above).
		own, _ := refArgmax(gotLogits[i*m.out : (i+1)*m.out])
		if got != own || got != wantClasses[i] && !near(wantLogits[i*m.out+int(got)], wantLogits[i*m.out+int(wantClasses[i])]) {
			t.Fatalf("row %d: class %d, want %d (device logits say %d)", i, got, wantClasses[i], own)
		}
	}
	r.sync()
}

// scenarioMLPForward runs mlp_forward and the six-kernel path it replaces
// (matmul → bias → relu → matmul → bias → argmax) on random networks of
// several shapes (the MLP example's 8→16→4 first; hidden layers wider
// than the 256-thread block; the largest widths, 1024), with a tie and a
// NaN among the scores, parameters laid out as the MLP stage holds them
// (one buffer W1, b1, W2, b2; x, h, scores and argmax's bytes in another).
// Scores and argmax bytes must be bit-identical between the two paths and
// to the pure-Go reference; the fused launch runs directly, and as a
// one-command batch twice (recorded, then replayed from the graph cache).
func scenarioMLPForward(t *testing.T, p *Platform) {
	r := newRig(t, p)
	rnd := rand.New(rand.NewPCG(11, 12))
	for si, sh := range [][3]int{{8, 16, 4}, {1, 1, 1}, {24, 32, 10}, {5, 300, 7}, {3, 1024, 1024}, {700, 2, 3}} {
		in, hid, cls := sh[0], sh[1], sh[2]
		x, w1, b1 := randF32(rnd, in), randF32(rnd, in*hid), randF32(rnd, hid)
		w2, b2 := randF32(rnd, hid*cls), randF32(rnd, cls)
		wantIdx := -1
		switch si {
		case 2: // a tie for the largest score: the first wins
			for k := range hid {
				w2[k*cls+3] = w2[k*cls+1]
			}
			b2[1], b2[3] = 1000, 1000
			wantIdx = 1
		case 3: // a NaN first score wins
			b2[0] = float32(math.NaN())
			wantIdx = 0
		}
		oB1, oW2 := in*hid, in*hid+hid
		oB2 := oW2 + hid*cls
		params := append(append(append(append([]float32(nil), w1...), b1...), w2...), b2...)
		weights := r.upload(params)
		oH, oS := 4*in, 4*(in+hid)
		oOut := oS + 4*cls
		work := r.alloc(oOut+8, 0)
		r.write(work, 0, f32bytes(x))
		wa := func(off, n int) hw.Arg { return hw.BufferArg(weights, 4*off, 4*n) }
		xa, ha, sa := hw.BufferArg(work, 0, 4*in), hw.BufferArg(work, oH, 4*hid), hw.BufferArg(work, oS, 4*cls)
		outa := hw.BufferArg(work, oOut, 8)
		u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
		clearOut := func() { r.write(work, oH, make([]byte, oOut+8-oH)) }
		result := func() ([]float32, []byte) {
			b := r.read(work, oS, 4*cls+8)
			return bytesF32(b[:4*cls]), b[4*cls:]
		}

		clearOut()
		r.submit("matmul", 0, xa, wa(0, in*hid), ha, u(1), u(hid), u(in))
		r.submit("bias", 0, ha, wa(oB1, hid), u(1), u(hid))
		r.submit("relu", 0, ha)
		r.submit("matmul", 0, ha, wa(oW2, hid*cls), sa, u(1), u(cls), u(hid))
		r.submit("bias", 0, sa, wa(oB2, cls), u(1), u(cls))
		r.submit("argmax", 0, sa, outa)
		six, sixOut := result()

		ref, refIdx, refV := refMLPForward(x, w1, b1, w2, b2)
		assertBits(t, fmt.Sprintf("%v six-kernel scores", sh), six, ref)
		if idx := binary.LittleEndian.Uint32(sixOut); idx != refIdx || wantIdx >= 0 && idx != uint32(wantIdx) ||
			!sameBits(math.Float32frombits(binary.LittleEndian.Uint32(sixOut[4:])), refV) {
			t.Fatalf("%v: six-kernel argmax %x, reference %d (%v)", sh, sixOut, refIdx, refV)
		}

		fused := []hw.Arg{xa, wa(0, in*hid), wa(oB1, hid), wa(oW2, hid*cls), wa(oB2, cls), sa, outa, u(in), u(hid), u(cls)}
		for run := range 3 {
			clearOut()
			if run == 0 {
				r.submit("mlp_forward", 0, fused...)
			} else if _, err := r.s.(*Stream).SubmitBatch([]hw.Command{{Program: r.prog("mlp_forward"), Args: fused}}); err != nil {
				t.Fatal(err)
			}
			got, gotOut := result()
			what := fmt.Sprintf("%v fused (run %d) scores", sh, run)
			assertBits(t, what, got, six)
			gotV := math.Float32frombits(binary.LittleEndian.Uint32(gotOut[4:]))
			sixV := math.Float32frombits(binary.LittleEndian.Uint32(sixOut[4:]))
			if string(gotOut[:4]) != string(sixOut[:4]) || !sameBits(gotV, sixV) {
				t.Fatalf("%v fused (run %d): argmax bytes %x, six kernels %x", sh, run, gotOut, sixOut)
			}
		}
	}
	r.sync()
}

// scenarioSharedSpin: the spin kernel polls a word of a shared allocation
// through its device view; the host's Store32Release (plus the visibility
// action) releases it. It returns the store-to-retirement latency.
func scenarioSharedSpin(t *testing.T, p *Platform) time.Duration {
	r := newRig(t, p)
	budget := hw.NewBudget("shared", 1<<20)
	sh, err := p.AllocShared(64, p.Devices()[:1], budget)
	if err != nil {
		t.Fatalf("AllocShared: %v", err)
	}
	defer func() {
		if err := sh.Free(); err != nil {
			t.Errorf("Free: %v", err)
		}
		if budget.Used() != 0 {
			t.Errorf("budget still holds %d bytes", budget.Used())
		}
	}()
	if budget.Used() != 64 {
		t.Fatalf("budget used %d, want 64", budget.Used())
	}
	for i, v := range sh.Bytes() {
		if v != 0 {
			t.Fatalf("shared byte %d = %#x, want 0", i, v)
		}
	}
	view, err := sh.View(r.dev)
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	release, err := sh.PrepareRelease(r.dev, 0, 64)
	if err != nil {
		t.Fatalf("PrepareRelease: %v", err)
	}
	const run = 1
	// spin(buf, off, want): the word at byte 4 of the view's range [0, 64).
	c := r.submit("spin", 0, hw.BufferArg(view, 0, 64), hw.Uint(4), hw.Uint(run))
	// Whatever happens, release the kernel so teardown cannot hang.
	defer sh.Store32Release(4, run)
	time.Sleep(50 * time.Millisecond)
	if c.Done() || r.s.Idle() {
		t.Fatalf("spin retired before the host stored RUN")
	}
	short, cancel := context.WithTimeout(r.ctx, 20*time.Millisecond)
	err = c.Wait(short)
	cancel()
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a spinning kernel past its deadline = %v", err)
	}
	start := time.Now()
	sh.Store32Release(4, run)
	if err := release.Execute(); err != nil {
		t.Fatalf("visibility action: %v", err)
	}
	if err := c.Wait(r.ctx); err != nil {
		t.Fatalf("spin wait: %v", err)
	}
	lat := time.Since(start)
	if sh.Load32Acquire(4) != run {
		t.Fatalf("Load32Acquire = %d", sh.Load32Acquire(4))
	}
	if lat > 2*time.Second {
		t.Fatalf("spin saw the store only after %v", lat)
	}
	return lat
}

// scenarioGraph records fill+saxpy into a graph and replays it.
func scenarioGraph(t *testing.T, p *Platform) {
	r := newRig(t, p)
	st := r.s.(*Stream)
	x, y := r.alloc(4*1000, 0), r.alloc(4*1000, 0)
	cmds := []hw.Command{
		{Program: r.prog("fill"), Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.Float32(2)}},
		{Program: r.prog("saxpy"), Args: []hw.Arg{hw.Float32(0.5), hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)}},
	}
	g, err := st.RecordGraph(cmds)
	if err != nil {
		t.Fatalf("RecordGraph: %v", err)
	}
	if g.Kernels() != 2 {
		t.Fatalf("Kernels = %d", g.Kernels())
	}
	for range 3 {
		if _, err := st.SubmitGraph(g); err != nil {
			t.Fatalf("SubmitGraph: %v", err)
		}
	}
	for i, v := range r.download(y) {
		if v != 3 {
			t.Fatalf("y[%d] = %v after three replays, want 3", i, v)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatalf("graph Close: %v", err)
	}
	if _, err := st.SubmitGraph(g); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("SubmitGraph after Close: %v", err)
	}
	bad := []hw.Command{{Program: r.prog("fill"), Args: []hw.Arg{hw.Float32(1)}}}
	if _, err := st.RecordGraph(bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "graph command 0") {
		t.Fatalf("RecordGraph(bad) = %v", err)
	}
}

// scenarioLost faults one stream and checks that the loss reaches every
// stream and call at once. It returns how long the fault took to surface.
func scenarioLost(t *testing.T, p *Platform) time.Duration {
	dev := p.Devices()[0]
	a, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	b, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := dev.Alloc(4096, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill, _ := dev.Prepare("fill")
	fault, _ := dev.Prepare("fault")
	ctx := testCtx(t)

	// Work on b before the fault retires normally.
	cb, err := b.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(1)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.Wait(ctx); err != nil {
		t.Fatalf("fill before fault: %v", err)
	}

	start := time.Now()
	cf, err := a.Submit(&hw.Command{Program: fault})
	if err != nil {
		t.Fatal(err)
	}
	err = cf.Wait(ctx)
	surfaced := time.Since(start)
	if !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("fault wait = %v, want ErrDeviceLost", err)
	}
	if derr := dev.Err(); !errors.Is(derr, errdefs.ErrDeviceLost) || !strings.Contains(derr.Error(), "CUDA_ERROR_") {
		t.Fatalf("Device.Err = %v, want a DeviceLost error naming the CUDA error", derr)
	}
	t.Logf("loss surfaced after %v: %v", surfaced, dev.Err())

	// Everything afterwards fails fast, on every stream.
	fast := func(what string, f func() error) {
		t.Helper()
		t0 := time.Now()
		err := f()
		if !errors.Is(err, errdefs.ErrDeviceLost) {
			t.Errorf("%s after loss = %v, want ErrDeviceLost", what, err)
		}
		if d := time.Since(t0); d > 100*time.Millisecond {
			t.Errorf("%s after loss took %v", what, d)
		}
	}
	fast("b.Submit", func() error {
		_, err := b.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(buf, 0, -1), hw.Float32(2)}})
		return err
	})
	fast("b.Write", func() error { _, err := b.Write(buf, 0, make([]byte, 16)); return err })
	fast("b.Sync", func() error { return b.Sync(ctx) })
	fast("a.Sync", func() error { return a.Sync(ctx) })
	fast("Alloc", func() error { _, err := dev.Alloc(64, 0, nil); return err })
	fast("NewStream", func() error { _, err := dev.NewStream(); return err })
	fast("Completion.Err", func() error { return cf.Err() })
	if !cf.Done() || !a.Idle() || !b.Idle() {
		t.Errorf("after loss: Done=%v a.Idle=%v b.Idle=%v, want all true", cf.Done(), a.Idle(), b.Idle())
	}
	if err := cb.Err(); err != nil {
		t.Errorf("work retired before the fault reports %v", err)
	}
	// Teardown works on a lost device and frees the budget.
	fast("a.Close", func() error { return a.Close(ctx) })
	fast("b.Close", func() error { return b.Close(ctx) })
	if err := buf.Free(); err != nil {
		t.Errorf("Free on lost device: %v", err)
	}
	return surfaced
}
