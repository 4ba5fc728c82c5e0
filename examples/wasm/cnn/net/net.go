// Package net is the CNN example's stage logic: a small image classifier
// built from the device op library only. No value is computed on the
// guest's CPU: a call uploads the image, submits the network as one batch
// and reads the class probabilities back, which is the call's only wait.
//
//	c = relu(conv2d(x; W, b))   3×3, pad 1: [1, K, H, W]
//	p = maxpool2d(c)            2×2, stride 2: [1, K, H/2, W/2]
//	y = softmax(p · Wd + bd)    [1, Classes]
//
// The dense layer is gemm.fast, the fast tier (cuBLAS on CUDA; on the
// simulator and the emulator the exact implementation), a program name
// with a dot that the session lists like any other.
// The weights are pseudo-random from Seed (see Values), uploaded once per
// instance. Input: H·W float32 values (one channel), little-endian; output:
// Classes float32 probabilities. reference.py computes the network in
// float64 with NumPy.
package net

import (
	"errors"
	"strconv"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// The network's shape.
const (
	H, W    = 12, 12
	K       = 4 // convolution channels
	R       = 3 // kernel size
	Classes = 10
	Flat    = K * (H / 2) * (W / 2)
	Seed    = 0xc22
)

// Programs are the programs the session must list.
var Programs = []string{"conv2d", "relu", "maxpool2d", "gemm.fast", "add", "softmax"}

// InputSize is the input's size in bytes; OutputSize the output's.
const (
	InputSize  = 4 * H * W
	OutputSize = 4 * Classes
)

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

// The parameters (float32 offsets).
const (
	offW    = 0
	offB    = offW + K*R*R
	offWd   = offB + K
	offBd   = offWd + Flat*Classes
	nParams = offBd + Classes
)

// Params returns W U(±1/2), b U(±1/8), Wd U(±1/8), bd U(±1/8), drawn with
// Values from Seed+i for the i-th tensor.
func Params() []float32 {
	var p []float32
	p = append(p, Values(Seed+0, K*R*R, 0.5)...)
	p = append(p, Values(Seed+1, K, 0.125)...)
	p = append(p, Values(Seed+2, Flat*Classes, 0.125)...)
	p = append(p, Values(Seed+3, Classes, 0.125)...)
	return p
}

// The work buffer (float32 offsets).
const (
	wX     = 0
	wConv  = wX + H*W
	wPool  = wConv + K*H*W
	wLogit = wPool + Flat
	wProb  = wLogit + Classes
	nWork  = wProb + Classes
)

type instance struct {
	s0   stagehost.Stream
	work stagehost.Buffer
	net  []stagehost.Command
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
	params, err := c.AllocNamed("cnn.params", 4*nParams)
	if err != nil {
		return nil, err
	}
	work, err := c.AllocNamed("cnn.work", 4*nWork)
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
	conv, pool, logits := w(wConv, 1, K, H, W), w(wPool, 1, K, H/2, W/2), w(wLogit, 1, Classes)
	var o stagehost.Ops
	o.Conv2d(w(wX, 1, 1, H, W), p(offW, K, 1, R, R), p(offB, K), conv, stagehost.ConvOpts{Pad: [2]int{1, 1}}).
		Launch("relu", conv.Arg()).
		Maxpool2d(conv, pool, [2]int{2, 2}, [2]int{2, 2}, [2]int{}).
		Gemm(pool.Reshape(1, Flat), p(offWd, Flat, Classes), logits, stagehost.GemmOpts{Fast: true}).
		Add(logits, p(offBd, Classes), logits).
		Softmax(logits, w(wProb, 1, Classes), 0)
	if err := o.Err(); err != nil {
		return nil, err
	}
	inst = &instance{s0: s0, work: work, net: append([]stagehost.Command(nil), o.Commands()...)}
	return inst, nil
}

// Run is the stage: the class probabilities of one image.
func Run(c *stagehost.Call) error {
	in := c.Input()
	if len(in) != InputSize {
		return &inputError{len(in)}
	}
	st, err := setup(c)
	if err != nil {
		return err
	}
	s := st.s0
	var out [OutputSize]byte
	err = s.Write(st.work, 4*wX, in)
	if err == nil {
		err = s.SubmitBatch(st.net...) // the whole network: one batch
	}
	if err == nil {
		err = s.Read(st.work, 4*wProb, out[:]) // the call's one wait
	}
	if err == nil {
		err = s.Sync() // idle by now: reports a failed launch without waiting
	}
	if err != nil {
		if errors.Is(err, stagehost.ErrInvalidArgument) {
			inst = nil
		}
		return err
	}
	return c.Write(out[:])
}

type inputError struct{ n int }

func (e *inputError) Error() string {
	return "cnn: input must be " + strconv.Itoa(InputSize) + " bytes, got " + strconv.Itoa(e.n)
}

func (e *inputError) Unwrap() error { return stagehost.ErrInvalidArgument }
