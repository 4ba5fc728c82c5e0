// Package block is the transformer example's stage logic: one pre-norm
// transformer block (batch 1, sequence S, width D, H causal attention
// heads, a GELU MLP of width F) built from the device op library only. No
// value is computed on the guest's CPU: a call uploads the input, submits
// the whole block as one batch and reads the output back, which is the
// call's only wait.
//
//	ln1  = layernorm(x; g1, b1)
//	qkv  = ln1 · Wqkv                        [S, 3D]
//	q, k, v = transpose(qkv as [S, 3, H, d] → [3, H, S, d])
//	p    = softmax(causal, (q · kᵀ) / √d)    per head, [H, S, S]
//	a    = transpose(p · v as [H, S, d] → [S, H, d])
//	h    = x + a · Wo
//	ln2  = layernorm(h; g2, b2)
//	y    = h + (gelu_tanh(ln2 · W1 + c1) · W2 + c2)
//
// The weights are pseudo-random from Seed (see Values), uploaded once per
// instance. Input: S·D float32 values, little-endian; output the same.
// reference.py computes the block in float64 with NumPy.
package block

import (
	"errors"
	"math"
	"strconv"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// The block's shape: S (sequence length), D (width) and H (heads) are
// 8, 32 and 4 (shape_small.go), or 128, 512 and 8 when built with the tag
// block128 (shape_128.go: transformer128.wasm, for benchmarks).
const (
	Dh   = D / H  // head width
	F    = 4 * D  // MLP width
	Eps  = 1e-5   // layernorm epsilon
	Seed = 0x5eed // the weights' seed
)

// Programs are the programs the session must list.
var Programs = []string{"layernorm", "gemm", "transpose", "affine", "softmax", "add", "gelu_tanh"}

// InputSize is the input's and the output's size in bytes.
const InputSize = 4 * S * D

// Values returns n pseudo-random float32 values in [-scale, scale): a
// 32-bit LCG (state = state·1664525 + 1013904223 mod 2^32, starting from
// seed), each value ((state>>8)/2^23 - 1)·scale, exact in float32 when
// scale is a power of two.
func Values(seed uint32, n int, scale float32) []float32 {
	v := make([]float32, n)
	s := seed
	for i := range v {
		s = s*1664525 + 1013904223
		v[i] = (float32(s>>8)/(1<<23) - 1) * scale
	}
	return v
}

// The parameters, in this order, in one buffer (float32 offsets).
const (
	offG1   = 0
	offB1   = offG1 + D
	offWqkv = offB1 + D
	offWo   = offWqkv + D*3*D
	offG2   = offWo + D*D
	offB2   = offG2 + D
	offW1   = offB2 + D
	offC1   = offW1 + D*F
	offW2   = offC1 + F
	offC2   = offW2 + F*D
	nParams = offC2 + D
)

// Params returns the parameters: gammas 1 + U(±1/4), betas and biases
// U(±1/8), Wqkv and Wo U(±1/4), W1 U(±1/4), W2 U(±1/8), each drawn with
// Values from Seed+i for the i-th tensor.
func Params() []float32 {
	p := make([]float32, 0, nParams)
	one := func(v []float32) []float32 {
		for i := range v {
			v[i] = 1 + v[i]
		}
		return v
	}
	p = append(p, one(Values(Seed+0, D, 0.25))...)
	p = append(p, Values(Seed+1, D, 0.125)...)
	p = append(p, Values(Seed+2, D*3*D, 0.25)...)
	p = append(p, Values(Seed+3, D*D, 0.25)...)
	p = append(p, one(Values(Seed+4, D, 0.25))...)
	p = append(p, Values(Seed+5, D, 0.125)...)
	p = append(p, Values(Seed+6, D*F, 0.25)...)
	p = append(p, Values(Seed+7, F, 0.125)...)
	p = append(p, Values(Seed+8, F*D, 0.125)...)
	p = append(p, Values(Seed+9, D, 0.125)...)
	return p
}

// The work buffer (float32 offsets).
const (
	wX     = 0
	wLn1   = wX + S*D
	wQKV   = wLn1 + S*D
	wQKVT  = wQKV + S*3*D
	wScore = wQKVT + 3*S*D
	wAttn  = wScore + H*S*S
	wAttnT = wAttn + S*D
	wProj  = wAttnT + S*D
	wH     = wProj + S*D
	wLn2   = wH + S*D
	wM1    = wLn2 + S*D
	wM2    = wM1 + S*F
	wOut   = wM2 + S*D
	nWork  = wOut + S*D
)

type instance struct {
	s0     stagehost.Stream
	work   stagehost.Buffer
	layer  []stagehost.Command
	params stagehost.Buffer
}

var inst *instance

func setup(c *stagehost.Call) (*instance, error) {
	s0, err := c.Stream("s0")
	if err != nil {
		return nil, err
	}
	if inst != nil && inst.s0 == s0 {
		return inst, nil
	}
	params, err := c.AllocNamed("transformer.params", 4*nParams)
	if err != nil {
		return nil, err
	}
	work, err := c.AllocNamed("transformer.work", 4*nWork)
	if err != nil {
		return nil, err
	}
	if err := s0.Write(params, 0, stagehost.Float32Bytes(Params())); err != nil {
		return nil, err
	}
	p := func(off int, dims ...int) stagehost.Tensor {
		return stagehost.NewTensor(params, 4*off, stagehost.DTypeF32, dims...)
	}
	w := func(off int, dims ...int) stagehost.Tensor {
		return stagehost.NewTensor(work, 4*off, stagehost.DTypeF32, dims...)
	}
	x, ln1, qkv := w(wX, S, D), w(wLn1, S, D), w(wQKV, S, 3*D)
	q, k, v := w(wQKVT, H, S, Dh), w(wQKVT+S*D, H, S, Dh), w(wQKVT+2*S*D, H, S, Dh)
	scores, attn, attnT := w(wScore, H, S, S), w(wAttn, H, S, Dh), w(wAttnT, S, D)
	proj, h, ln2 := w(wProj, S, D), w(wH, S, D), w(wLn2, S, D)
	m1, m2, out := w(wM1, S, F), w(wM2, S, D), w(wOut, S, D)

	var o stagehost.Ops
	o.Layernorm(x, p(offG1, D), p(offB1, D), ln1, Eps).
		Gemm(ln1, p(offWqkv, D, 3*D), qkv, stagehost.GemmOpts{}).
		Transpose(qkv.Reshape(S, 3, H, Dh), w(wQKVT, 3, H, S, Dh), 1, 2, 0, 3).
		Gemm(q, k, scores, stagehost.GemmOpts{TransB: true}).
		Affine(scores, scores, float32(1/math.Sqrt(Dh)), 0).
		Softmax(scores, scores, S).
		Gemm(scores, v, attn, stagehost.GemmOpts{}).
		Transpose(attn, attnT.Reshape(S, H, Dh), 1, 0, 2).
		Gemm(attnT, p(offWo, D, D), proj, stagehost.GemmOpts{}).
		Add(x, proj, h).
		Layernorm(h, p(offG2, D), p(offB2, D), ln2, Eps).
		Gemm(ln2, p(offW1, D, F), m1, stagehost.GemmOpts{}).
		Add(m1, p(offC1, F), m1).
		GeluTanh(m1, m1).
		Gemm(m1, p(offW2, F, D), m2, stagehost.GemmOpts{}).
		Add(m2, p(offC2, D), m2).
		Add(h, m2, out)
	if err := o.Err(); err != nil {
		return nil, err
	}
	inst = &instance{s0: s0, work: work, params: params, layer: append([]stagehost.Command(nil), o.Commands()...)}
	return inst, nil
}

// Run is the stage: one block on the input. The input is read into the
// SDK's reused buffer and the output downloaded through it (InputView,
// WriteFrom), so a call allocates nothing in the guest.
func Run(c *stagehost.Call) error {
	in, err := c.InputView()
	if err != nil {
		return err
	}
	if len(in) != InputSize {
		return &inputError{len(in)}
	}
	st, err := setup(c)
	if err != nil {
		return err
	}
	s := st.s0
	err = s.Write(st.work, 4*wX, in)
	if err == nil {
		err = s.SubmitBatch(st.layer...) // the whole block: one batch
	}
	if err == nil {
		err = c.WriteFrom(s, st.work, 4*wOut, InputSize) // the call's one wait
	}
	if err == nil {
		err = s.Sync() // idle by now: reports a failed launch without waiting
	}
	if err != nil && errors.Is(err, stagehost.ErrInvalidArgument) {
		inst = nil
	}
	return err
}

type inputError struct{ n int }

func (e *inputError) Error() string {
	return "transformer: input must be " + strconv.Itoa(InputSize) + " bytes, got " + strconv.Itoa(e.n)
}

func (e *inputError) Unwrap() error { return stagehost.ErrInvalidArgument }
