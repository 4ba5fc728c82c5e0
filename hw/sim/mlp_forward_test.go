package sim_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// mlpNet is a two-layer perceptron with one input row, laid out as the
// MLP example stage holds it: the parameters W1, b1, W2, b2 in one buffer,
// and x, h, scores and argmax's 8 bytes in a work buffer.
type mlpNet struct {
	in, hid, cls int
	x, w1, b1    []float32
	w2, b2       []float32
}

func randNet(r *rand.Rand, in, hid, cls int) *mlpNet {
	v := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64()) // products rarely exact: rounding shows
		}
		return x
	}
	return &mlpNet{in: in, hid: hid, cls: cls, x: v(in), w1: v(in * hid), b1: v(hid), w2: v(hid * cls), b2: v(cls)}
}

// reference computes the network in plain Go: each sum from 0 in order,
// products rounded before adding.
func (n *mlpNet) reference() ([]float32, uint32, float32) {
	h := make([]float32, n.hid)
	for j := range h {
		var s float32
		for k := range n.in {
			s += float32(n.x[k] * n.w1[k*n.hid+j])
		}
		h[j] = s + n.b1[j]
		if h[j] < 0 {
			h[j] = 0
		}
	}
	scores := make([]float32, n.cls)
	for j := range scores {
		var s float32
		for k := range n.hid {
			s += float32(h[k] * n.w2[k*n.cls+j])
		}
		scores[j] = s + n.b2[j]
	}
	best := 0
	for j := range scores {
		if scores[j] > scores[best] {
			best = j
		}
	}
	return scores, uint32(best), scores[best]
}

// mlpRun holds one network's buffers on a device and runs it either way.
type mlpRun struct {
	r        *rig
	n        *mlpNet
	w, work  *sim.Buffer
	oW1, oB1 int // float32 offsets in w
	oW2, oB2 int
	oH, oS   int // byte offsets in work
	oOut     int
}

func newMLPRun(r *rig, n *mlpNet) *mlpRun {
	m := &mlpRun{r: r, n: n}
	m.oW1, m.oB1 = 0, n.in*n.hid
	m.oW2 = m.oB1 + n.hid
	m.oB2 = m.oW2 + n.hid*n.cls
	m.w = r.alloc(r.dev, 4*(m.oB2+n.cls))
	params := append(append(append(append([]float32(nil), n.w1...), n.b1...), n.w2...), n.b2...)
	putF32(host(r.t, m.w), params...)
	m.oH = 4 * n.in
	m.oS = m.oH + 4*n.hid
	m.oOut = m.oS + 4*n.cls
	m.work = r.alloc(r.dev, m.oOut+8)
	putF32(host(r.t, m.work), n.x...)
	return m
}

func (m *mlpRun) wArg(off, n int) hw.Arg { return hw.BufferArg(m.w, 4*off, 4*n) }

// fusedArgs are mlp_forward's arguments.
func (m *mlpRun) fusedArgs() []hw.Arg {
	n := m.n
	return []hw.Arg{
		hw.BufferArg(m.work, 0, 4*n.in), m.wArg(m.oW1, n.in*n.hid), m.wArg(m.oB1, n.hid),
		m.wArg(m.oW2, n.hid*n.cls), m.wArg(m.oB2, n.cls),
		hw.BufferArg(m.work, m.oS, 4*n.cls), hw.BufferArg(m.work, m.oOut, 8),
		hw.Uint(uint64(n.in)), hw.Uint(uint64(n.hid)), hw.Uint(uint64(n.cls)),
	}
}

// run clears the outputs, runs the network (fused or as six launches) and
// returns the scores and argmax's 8 bytes.
func (m *mlpRun) run(fused bool) ([]float32, []byte) {
	r, n := m.r, m.n
	clear(host(r.t, m.work)[m.oH:])
	if fused {
		r.submit(r.st, r.prog(r.dev, "mlp_forward"), m.fusedArgs()...)
	} else {
		x := hw.BufferArg(m.work, 0, 4*n.in)
		h := hw.BufferArg(m.work, m.oH, 4*n.hid)
		s := hw.BufferArg(m.work, m.oS, 4*n.cls)
		u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
		r.submit(r.st, r.prog(r.dev, "matmul"), x, m.wArg(m.oW1, n.in*n.hid), h, u(1), u(n.hid), u(n.in))
		r.submit(r.st, r.prog(r.dev, "bias"), h, m.wArg(m.oB1, n.hid), u(1), u(n.hid))
		r.submit(r.st, r.prog(r.dev, "relu"), h)
		r.submit(r.st, r.prog(r.dev, "matmul"), h, m.wArg(m.oW2, n.hid*n.cls), s, u(1), u(n.cls), u(n.hid))
		r.submit(r.st, r.prog(r.dev, "bias"), s, m.wArg(m.oB2, n.cls), u(1), u(n.cls))
		r.submit(r.st, r.prog(r.dev, "argmax"), s, hw.BufferArg(m.work, m.oOut, 8))
	}
	r.sync(r.st)
	b := host(r.t, m.work)
	return getF32(b[m.oS:m.oOut]), append([]byte(nil), b[m.oOut:m.oOut+8]...)
}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// TestMLPForwardMatchesSixKernels: mlp_forward writes the same scores and
// argmax bytes, bit for bit, as matmul → bias → relu → matmul → bias →
// argmax, and as the plain Go reference, on random networks of several
// shapes (the example's 8→16→4 first), with a tie and a NaN score.
func TestMLPForwardMatchesSixKernels(t *testing.T) {
	r := newRig(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	shapes := [][3]int{{8, 16, 4}, {1, 1, 1}, {24, 32, 10}, {5, 300, 7}, {3, 1024, 1024}, {700, 2, 3}}
	for si, sh := range shapes {
		for rep := range 4 {
			n := randNet(rnd, sh[0], sh[1], sh[2])
			switch {
			case si == 2 && rep == 1: // a tie for the largest score: the first wins
				for k := range n.hid {
					n.w2[k*n.cls+3] = n.w2[k*n.cls+1]
				}
				n.b2[1], n.b2[3] = 1000, 1000
			case si == 3 && rep == 1: // a NaN first score wins
				n.b2[0] = float32(math.NaN())
			}
			m := newMLPRun(r, n)
			six, sixOut := m.run(false)
			fused, fusedOut := m.run(true)
			ref, idx, val := n.reference()
			for j := range ref {
				if !sameBits(fused[j], six[j]) || !sameBits(fused[j], ref[j]) {
					t.Fatalf("%v #%d: score %d: fused %x, six kernels %x, reference %x", sh, rep, j,
						math.Float32bits(fused[j]), math.Float32bits(six[j]), math.Float32bits(ref[j]))
				}
			}
			fi, fv := binary.LittleEndian.Uint32(fusedOut), math.Float32frombits(binary.LittleEndian.Uint32(fusedOut[4:]))
			if string(fusedOut) != string(sixOut) || fi != idx || !sameBits(fv, val) {
				t.Fatalf("%v #%d: argmax bytes fused %x, six kernels %x; reference %d (%v)", sh, rep, fusedOut, sixOut, idx, val)
			}
			if si == 2 && rep == 1 && fi != 1 || si == 3 && rep == 1 && fi != 0 {
				t.Fatalf("%v #%d: argmax %d", sh, rep, fi)
			}
		}
	}
}

// TestMLPForwardArgumentErrors: malformed mlp_forward launches fail their
// command with an error that matches ErrInvalidArgument.
func TestMLPForwardArgumentErrors(t *testing.T) {
	r := newRig(t)
	m := newMLPRun(r, randNet(rand.New(rand.NewPCG(3, 4)), 2, 3, 2))
	with := func(i int, a hw.Arg) []hw.Arg {
		args := m.fusedArgs()
		args[i] = a
		return args
	}
	sc := hw.BufferArg(m.work, m.oS, 8)
	for _, tc := range []struct {
		name  string
		args  []hw.Arg
		words []string
	}{
		{"count", m.fusedArgs()[:9], []string{"10 arguments, got 9"}},
		{"I=0", with(7, hw.Uint(0)), []string{"I=0 H=3 C=2", "I ≥ 1"}},
		{"H=0", with(8, hw.Uint(0)), []string{"I=2 H=0 C=2"}},
		{"H too wide", with(8, hw.Uint(1025)), []string{"H=1025", "1024"}},
		{"C too wide", with(9, hw.Uint(1<<32)), []string{"C=4294967296"}},
		{"W1 size", with(1, m.wArg(m.oW1, 5)), []string{"argument 1 has 5 values, want 6"}},
		{"b2 size", with(4, m.wArg(m.oB2, 1)), []string{"argument 4 has 1 values, want 2"}},
		{"scores size", with(5, hw.BufferArg(m.work, m.oS, 12)), []string{"argument 5 has 3 values, want 2"}},
		{"out small", with(6, hw.BufferArg(m.work, m.oOut, 4)), []string{"argument 6 has 4 bytes"}},
		{"scores over x", with(5, hw.BufferArg(m.work, 0, 8)), []string{"argument 5 (an output) overlaps argument 0"}},
		{"out over scores", with(6, hw.BufferArg(m.work, m.oS+4, 8)), []string{"argument 5 (an output) overlaps argument 6"}},
		{"out over W2", with(6, m.wArg(m.oW2, 2)), []string{"argument 6 (an output) overlaps argument 3"}},
		{"scalar for x", with(0, hw.Uint(0)), []string{"argument 0 is a scalar"}},
		{"buffer for H", with(8, sc), []string{"argument 8 is a buffer"}},
		{"unaligned W2", with(3, hw.BufferArg(m.w, 4*m.oW2+2, 24)), []string{"aligned"}},
	} {
		c := r.submit(r.st, r.prog(r.dev, "mlp_forward"), tc.args...)
		err := c.Wait(ctxT(t))
		wantClass(t, err, errdefs.ErrFault, tc.words...)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: error %v does not also match ErrInvalidArgument", tc.name, err)
		}
	}
	// Each Sync reports one failure not yet reported.
	failures := 0
	for r.st.Sync(ctxT(t)) != nil {
		failures++
	}
	if failures == 0 {
		t.Fatal("Sync did not report the failures")
	}
	// The stream goes on, and a valid launch still computes.
	fused, _ := m.run(true)
	ref, _, _ := m.n.reference()
	for j := range ref {
		if !sameBits(fused[j], ref[j]) {
			t.Fatalf("after the failures: score %d = %v, want %v", j, fused[j], ref[j])
		}
	}
}
