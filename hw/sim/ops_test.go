package sim_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/internal/ops"
	"github.com/stagehost/stagehost/hw/sim"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// An op launch that breaks its contract is refused by Submit and
// SubmitBatch, before anything is enqueued, with the op and the argument
// named.
func TestOpsAreValidatedAtSubmit(t *testing.T) {
	r := newRig(t)
	x, y := r.alloc(r.dev, 4*4096), r.alloc(r.dev, 4*4097)
	p := r.prog(r.dev, "softmax")
	bad := hw.Command{Program: p, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(1), hw.Uint(4097), hw.Uint(0)}}
	_, err := r.st.Submit(&bad)
	wantClass(t, err, errdefs.ErrInvalidArgument, "softmax: x has 4,096 values, rows*cols = 4,097")
	if n := r.st.Submitted(); n != 0 {
		t.Fatalf("%d commands enqueued after a refused submit", n)
	}
	good := hw.Command{Program: p, Args: []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, 4*4096), hw.Uint(1), hw.Uint(4096), hw.Uint(0)}}
	_, err = r.st.SubmitBatch([]hw.Command{good, bad})
	wantClass(t, err, errdefs.ErrInvalidArgument, "command 1", "softmax: x has 4,096 values")
	if n := r.st.Submitted(); n != 0 {
		t.Fatalf("%d commands enqueued after a refused batch", n)
	}
	// The refused commands left their buffers unpinned: they can be freed.
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
	// A partial overlap on one buffer.
	z := r.alloc(r.dev, 64)
	_, err = r.st.Submit(&hw.Command{Program: r.prog(r.dev, "exp"), Args: []hw.Arg{hw.BufferArg(z, 0, 32), hw.BufferArg(z, 16, 32)}})
	wantClass(t, err, errdefs.ErrInvalidArgument, "exp: y partially overlaps x")
	var oe *ops.Error
	if !errors.As(err, &oe) || oe.Arg != "y" {
		t.Fatalf("error %v does not carry the op's argument", err)
	}
}

// gemm with alpha = 1, beta = 0 and batch = 1 is matmul bit for bit.
func TestGemmIsMatmulBitForBit(t *testing.T) {
	r := newRig(t)
	rnd := rand.New(rand.NewPCG(1, 1))
	const m, n, k = 7, 9, 300
	a, b := r.alloc(r.dev, 4*m*k), r.alloc(r.dev, 4*k*n)
	c1, c2 := r.alloc(r.dev, 4*m*n), r.alloc(r.dev, 4*m*n)
	for _, buf := range []*sim.Buffer{a, b} {
		h := host(t, buf)
		for i := 0; i < len(h); i += 4 {
			binary.NativeEndian.PutUint32(h[i:], math.Float32bits(float32(rnd.NormFloat64()*100)))
		}
	}
	r.submit(r.st, r.prog(r.dev, "matmul"), hw.BufferArg(a, 0, -1), hw.BufferArg(b, 0, -1), hw.BufferArg(c1, 0, -1), hw.Uint(m), hw.Uint(n), hw.Uint(k))
	putF32(host(t, c2), float32(math.NaN())) // beta = 0: never read
	r.submit(r.st, r.prog(r.dev, "gemm"), hw.BufferArg(a, 0, -1), hw.BufferArg(b, 0, -1), hw.BufferArg(c2, 0, -1),
		hw.Uint(m), hw.Uint(n), hw.Uint(k), hw.Uint(0), hw.Uint(0), hw.Float32(1), hw.Float32(0), hw.Uint(1), hw.Uint(0), hw.Uint(0), hw.Uint(0))
	r.sync(r.st)
	if !bytes.Equal(host(t, c1), host(t, c2)) {
		t.Fatal("gemm(alpha=1, beta=0) differs from matmul")
	}
}

// launchArg is one argument of a random launch.
type launchArg struct {
	buffer bool
	data   []byte
	value  uint64
}

// TestOpsSimEqualsEmuBitForBit runs every program of the op library on
// random valid inputs through the simulator and through the SDK emulator,
// and compares every buffer byte for byte.
func TestOpsSimEqualsEmuBitForBit(t *testing.T) {
	rnd := rand.New(rand.NewPCG(2, 3))
	count := 0
	for _, info := range sim.KernelInfos() {
		if info.Tier == "" {
			continue
		}
		for trial := range 5 {
			args := randomLaunch(rnd, info)
			simOut := runOnSim(t, info.Name, args)
			emuOut := runOnEmu(t, info.Name, args)
			for i := range args {
				if args[i].buffer && !bytes.Equal(simOut[i], emuOut[i]) {
					t.Errorf("%s trial %d: argument %d (%s) differs between sim and emu", info.Name, trial, i, info.Args[i].Name)
				}
			}
			count++
		}
	}
	if want := 5 * len(ops.Names()); count != want {
		t.Fatalf("%d launches compared, want %d (5 per program)", count, want)
	}
}

func runOnSim(t *testing.T, name string, args []launchArg) [][]byte {
	t.Helper()
	r := newRig(t)
	hargs := make([]hw.Arg, len(args))
	bufs := make([]*sim.Buffer, len(args))
	for i, a := range args {
		if !a.buffer {
			hargs[i] = hw.Uint(a.value)
			continue
		}
		bufs[i] = r.alloc(r.dev, max(len(a.data), 1))
		copy(host(t, bufs[i]), a.data)
		hargs[i] = hw.BufferArg(bufs[i], 0, len(a.data))
	}
	c, err := r.st.Submit(&hw.Command{Program: r.prog(r.dev, name), Args: hargs})
	if err != nil {
		t.Fatalf("sim %s: %v", name, err)
	}
	_ = c
	r.sync(r.st)
	out := make([][]byte, len(args))
	for i, b := range bufs {
		if b != nil {
			out[i] = bytes.Clone(host(t, b)[:len(args[i].data)])
		}
	}
	return out
}

func runOnEmu(t *testing.T, name string, args []launchArg) [][]byte {
	t.Helper()
	e := emu.New(emu.NewConfig()).Stream("s").Programs(name)
	names := make([]string, len(args))
	for i, a := range args {
		if a.buffer {
			names[i] = "b" + string(rune('a'+i))
			e.BufferData(names[i], a.data)
		}
	}
	e.Stage("main", func(c *stagehost.Call) error {
		s, err := c.Stream("s")
		if err != nil {
			return err
		}
		p, err := c.Program(name)
		if err != nil {
			return err
		}
		sargs := make([]stagehost.Arg, len(args))
		for i, a := range args {
			if !a.buffer {
				sargs[i] = stagehost.U64(a.value)
				continue
			}
			b, err := c.Buffer(names[i])
			if err != nil {
				return err
			}
			sargs[i] = stagehost.Whole(b)
		}
		if err := s.Submit(p, sargs...); err != nil {
			return err
		}
		return s.Sync()
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatalf("emu %s: %v", name, err)
	}
	out := make([][]byte, len(args))
	for i := range args {
		if args[i].buffer {
			b, _ := e.Bytes(names[i])
			out[i] = b
		}
	}
	return out
}

var specials = []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, 3e38, -1, 1}

// values encodes n random values (a few special) in type typ.
func values(r *rand.Rand, typ string, n int, scale float64) []byte {
	b := make([]byte, n*typeSize(typ))
	for i := range n {
		v := float32(r.NormFloat64() * scale)
		if r.IntN(10) == 0 {
			v = specials[r.IntN(len(specials))]
		}
		switch typ {
		case "f16":
			binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToF16(v))
		case "bf16":
			binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToBF16(v))
		case "i32":
			binary.LittleEndian.PutUint32(b[4*i:], uint32(r.Int32N(1<<20)-1<<19))
		default:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b
}

func typeSize(typ string) int {
	if typ == "f16" || typ == "bf16" {
		return 2
	}
	return 4
}

func f32arg(v float32) launchArg { return launchArg{value: uint64(math.Float32bits(v))} }
func u(v int) launchArg          { return launchArg{value: uint64(v)} }
func packed(h, w int) launchArg  { return launchArg{value: uint64(h) | uint64(w)<<32} }

// randomLaunch builds a valid random launch of the op library's program
// described by info.
func randomLaunch(r *rand.Rand, info hw.KernelInfo) []launchArg {
	op, _, _ := strings.Cut(info.Name, ".")
	typ := info.Args[0].Type
	in := func(n int, scale float64) launchArg { return launchArg{buffer: true, data: values(r, typ, n, scale)} }
	out := func(n int) launchArg { return launchArg{buffer: true, data: values(r, typ, n, 1)} }
	between := func(lo, hi int) int { return lo + r.IntN(hi-lo+1) }
	switch op {
	case "affine":
		n := between(1, 300)
		return []launchArg{in(n, 10), out(n), f32arg(float32(r.NormFloat64())), f32arg(float32(r.NormFloat64()))}
	case "add", "sub", "mul", "div", "max", "min":
		var a, b [4]int
		na, nb, nc := 1, 1, 1
		for i := range 4 {
			c := between(1, 4)
			a[i], b[i] = c, c
			switch r.IntN(3) {
			case 0:
				a[i] = 1
			case 1:
				b[i] = 1
			}
			na, nb, nc = na*a[i], nb*b[i], nc*c
		}
		args := []launchArg{in(na, 10), in(nb, 10), out(nc)}
		for _, d := range a {
			args = append(args, u(d))
		}
		for _, d := range b {
			args = append(args, u(d))
		}
		return args
	case "reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax":
		o, n, i := between(1, 3), between(1, 600), between(1, 3)
		y := out(o * i)
		if op == "reduce_argmax" {
			y = launchArg{buffer: true, data: make([]byte, 4*o*i)}
		}
		return []launchArg{in(o*n*i, 10), y, u(o), u(n), u(i)}
	case "softmax", "log_softmax":
		rows, cols := between(1, 6), between(1, 300)
		causal := 0
		if r.IntN(2) == 0 {
			causal = between(1, cols)
		}
		return []launchArg{in(rows*cols, 10), out(rows * cols), u(rows), u(cols), u(causal)}
	case "layernorm":
		rows, cols := between(1, 4), between(1, 600)
		return []launchArg{in(rows*cols, 3), in(cols, 1), in(cols, 1), out(rows * cols), u(rows), u(cols), f32arg(1e-5)}
	case "rmsnorm":
		rows, cols := between(1, 4), between(1, 600)
		return []launchArg{in(rows*cols, 3), in(cols, 1), out(rows * cols), u(rows), u(cols), f32arg(1e-6)}
	case "transpose":
		d := [4]int{between(1, 4), between(1, 4), between(1, 5), between(1, 6)}
		p := r.Perm(4)
		n := d[0] * d[1] * d[2] * d[3]
		return []launchArg{in(n, 10), out(n), u(d[0]), u(d[1]), u(d[2]), u(d[3]), u(p[0]), u(p[1]), u(p[2]), u(p[3])}
	case "gemm":
		m, n, k := between(1, 12), between(1, 12), between(1, 300)
		batch := between(1, 3)
		sa, sb, sc := m*k+r.IntN(3), n*k, m*n+r.IntN(2)
		if r.IntN(3) == 0 {
			sa = 0
		}
		beta := float32(0)
		if r.IntN(2) == 0 {
			beta = float32(r.NormFloat64())
		}
		return []launchArg{in((batch-1)*sa+m*k, 2), in((batch-1)*sb+k*n, 2), out((batch-1)*sc + m*n),
			u(m), u(n), u(k), u(r.IntN(2)), u(r.IntN(2)), f32arg(float32(r.NormFloat64())), f32arg(beta),
			u(batch), u(sa), u(sb), u(sc)}
	case "gather":
		rows, cols, n := between(1, 10), between(1, 8), between(1, 10)
		idx := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(idx[4*i:], uint32(int32(between(-2, rows+2))))
		}
		return []launchArg{in(rows*cols, 5), {buffer: true, data: idx}, out(n * cols), u(rows), u(cols)}
	case "conv2d":
		for {
			g := between(1, 2)
			n, c, k := between(1, 2), g*between(1, 2), g*between(1, 3)
			h, w, rr, s := between(3, 8), between(3, 8), between(1, 3), between(1, 3)
			sh, sw, ph, pw, dh, dw := between(1, 2), between(1, 2), between(0, 1), between(0, 1), between(1, 2), between(1, 2)
			p := h + 2*ph - dh*(rr-1) - 1
			q := w + 2*pw - dw*(s-1) - 1
			if p < 0 || q < 0 {
				continue
			}
			p, q = p/sh+1, q/sw+1
			return []launchArg{in(n*c*h*w, 3), in(k*(c/g)*rr*s, 1), in(k, 1), out(n * k * p * q),
				u(n), u(c), u(h), u(w), u(k), u(rr), u(s), packed(sh, sw), packed(ph, pw), packed(dh, dw), u(g)}
		}
	case "maxpool2d", "avgpool2d":
		n, c, h, w := between(1, 2), between(1, 3), between(2, 8), between(2, 8)
		rr, s := between(1, min(h, 3)), between(1, min(w, 3))
		sh, sw, ph, pw := between(1, 2), between(1, 2), between(0, 1), between(0, 1)
		p, q := (h+2*ph-rr)/sh+1, (w+2*pw-s)/sw+1
		return []launchArg{in(n*c*h*w, 5), out(n * c * p * q), u(n), u(c), u(h), u(w), u(rr), u(s), packed(sh, sw), packed(ph, pw)}
	case "cast":
		from, to := r.IntN(4), r.IntN(4)
		n := between(1, 50)
		tn := []string{"f32", "f16", "bf16", "i32"}
		return []launchArg{{buffer: true, data: values(r, tn[from], n, 1e3)}, {buffer: true, data: make([]byte, n*typeSize(tn[to]))}, u(from), u(to)}
	}
	// The unary ops.
	n := between(1, 300)
	return []launchArg{in(n, 10), out(n)}
}
