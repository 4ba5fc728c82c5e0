package emu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// mlpMem is one network's memory as the MLP example stage lays it out:
// params holds W1, b1, W2, b2; work holds x, h, scores and argmax's 8
// bytes.
type mlpMem struct {
	in, hid, cls  int
	params, work  []byte
	oB1, oW2, oB2 int // float32 offsets in params
	oH, oS, oOut  int // byte offsets in work
}

func newMLPMem(r *rand.Rand, in, hid, cls int) *mlpMem {
	m := &mlpMem{in: in, hid: hid, cls: cls}
	m.oB1 = in * hid
	m.oW2 = m.oB1 + hid
	m.oB2 = m.oW2 + hid*cls
	m.params = make([]byte, 4*(m.oB2+cls))
	for i := 0; i < len(m.params); i += 4 {
		binary.LittleEndian.PutUint32(m.params[i:], math.Float32bits(float32(r.NormFloat64())))
	}
	m.oH = 4 * in
	m.oS = m.oH + 4*hid
	m.oOut = m.oS + 4*cls
	m.work = make([]byte, m.oOut+8)
	for i := 0; i < m.oH; i += 4 {
		binary.LittleEndian.PutUint32(m.work[i:], math.Float32bits(float32(r.NormFloat64())))
	}
	return m
}

func (m *mlpMem) buf(mem []byte, off, n int) Arg {
	return Arg{Bytes: mem[off : off+n : off+n], Offset: off, buffer: true}
}

func (m *mlpMem) scalar(v uint64) Arg { return Arg{Value: v} }

func (m *mlpMem) w(off, n int) Arg { return m.buf(m.params, 4*off, 4*n) }

func (m *mlpMem) fused() []Arg {
	u := func(v int) Arg { return m.scalar(uint64(v)) }
	return []Arg{
		m.buf(m.work, 0, 4*m.in), m.w(0, m.in*m.hid), m.w(m.oB1, m.hid), m.w(m.oW2, m.hid*m.cls), m.w(m.oB2, m.cls),
		m.buf(m.work, m.oS, 4*m.cls), m.buf(m.work, m.oOut, 8), u(m.in), u(m.hid), u(m.cls),
	}
}

// run clears the outputs, runs the network fused or as the six built-ins,
// and returns the scores' and argmax's bytes.
func (m *mlpMem) run(t *testing.T, fused bool) string {
	t.Helper()
	clear(m.work[m.oH:])
	u := func(v int) Arg { return m.scalar(uint64(v)) }
	x, h, s := m.buf(m.work, 0, 4*m.in), m.buf(m.work, m.oH, 4*m.hid), m.buf(m.work, m.oS, 4*m.cls)
	steps := [][]any{{"mlp_forward", m.fused()}}
	if !fused {
		steps = [][]any{
			{"matmul", []Arg{x, m.w(0, m.in*m.hid), h, u(1), u(m.hid), u(m.in)}},
			{"bias", []Arg{h, m.w(m.oB1, m.hid), u(1), u(m.hid)}},
			{"relu", []Arg{h}},
			{"matmul", []Arg{h, m.w(m.oW2, m.hid*m.cls), s, u(1), u(m.cls), u(m.hid)}},
			{"bias", []Arg{s, m.w(m.oB2, m.cls), u(1), u(m.cls)}},
			{"argmax", []Arg{s, m.buf(m.work, m.oOut, 8)}},
		}
	}
	for _, st := range steps {
		if err := builtins[st[0].(string)](st[1].([]Arg)); err != nil {
			t.Fatalf("%s: %v", st[0], err)
		}
	}
	return string(m.work[m.oS:])
}

// TestMLPForwardMatchesSixKernels: the emulator's mlp_forward writes the
// same scores and argmax bytes as its six-kernel path, on random networks
// whose products round.
func TestMLPForwardMatchesSixKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][3]int{{8, 16, 4}, {1, 1, 1}, {24, 32, 10}, {5, 300, 7}, {3, 1024, 1024}} {
		for rep := range 3 {
			m := newMLPMem(r, sh[0], sh[1], sh[2])
			if six, fused := m.run(t, false), m.run(t, true); six != fused {
				t.Fatalf("%v #%d: fused %x, six kernels %x", sh, rep, fused, six)
			}
		}
	}
}

func TestMLPForwardArgumentErrors(t *testing.T) {
	m := newMLPMem(rand.New(rand.NewPCG(7, 8)), 2, 3, 2)
	with := func(i int, a Arg) []Arg {
		args := m.fused()
		args[i] = a
		return args
	}
	for _, tc := range []struct {
		name string
		args []Arg
		want string
	}{
		{"count", m.fused()[:9], "takes 10 arguments, got 9"},
		{"I=0", with(7, m.scalar(0)), "I=0 H=3 C=2: want I ≥ 1"},
		{"H wide", with(8, m.scalar(1025)), "H=1025"},
		{"C=0", with(9, m.scalar(0)), "C=0"},
		{"W2 size", with(3, m.w(m.oW2, 5)), "argument 3 has 5 values, want 6"},
		{"out small", with(6, m.buf(m.work, m.oOut, 4)), "argument 6 has 4 bytes"},
		{"scores over x", with(5, m.buf(m.work, 0, 8)), "argument 5 (an output) overlaps argument 0"},
		{"out over b1", with(6, m.w(m.oB1, 2)), "argument 6 (an output) overlaps argument 2"},
		{"scalar for x", with(0, m.scalar(0)), "argument 0 is a scalar"},
		{"buffer for C", with(9, m.w(0, 1)), "argument 9 is a buffer"},
		{"unaligned", with(2, Arg{Bytes: m.params[4*m.oB1+2 : 4*m.oB1+14], Offset: 4*m.oB1 + 2, buffer: true}), "not 4-byte aligned"},
	} {
		err := kernelMLPForward(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
