// Package net is the digits example's stage logic: a small CNN trained on
// scikit-learn's 8×8 digits (../train.py), run with the device op library
// only. No value is computed on the guest's CPU: a call uploads a batch
// of images, submits the whole network for the batch as one
// stream_submit_batch (each layer one launch over every image) and reads
// the probabilities back, which is the call's only wait. The weights are
// the session's [[weights]] "digits" (ABI revision 3), looked up by
// tensor name; the stage never writes them.
//
//	c1 = relu(conv2d(x; conv1))   1→8, 3×3, pad 1:  [N, 8, 8, 8]
//	p1 = maxpool2d(c1)            2×2, stride 2:    [N, 8, 4, 4]
//	c2 = relu(conv2d(p1; conv2))  8→16, 3×3, pad 1: [N, 16, 4, 4]
//	p2 = maxpool2d(c2)            2×2, stride 2:    [N, 16, 2, 2]
//	y  = softmax(p2·Wᵀ + b)       dense 64→10:      [N, 10]
//
// Input: N ≥ 1 images of 64 float32 values each (little-endian, row-major
// 8×8, pixel intensities in [0, 1]: scikit-learn's 0..16 divided by 16),
// N ≤ MaxImages. Output: N×10 float32 probabilities, image by image. Any
// other input size is INVALID_ARGUMENT.
package net

import (
	"errors"
	"strconv"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// The network's shape.
const (
	Pixels    = 64 // 8×8, one channel
	Classes   = 10
	MaxImages = 512 // images per call
	C1, C2    = 8, 16
)

// ImageSize is one image's size in bytes; ResultSize one image's output.
const (
	ImageSize  = 4 * Pixels
	ResultSize = 4 * Classes
)

// Programs are the programs the session must list.
var Programs = []string{"conv2d", "relu", "maxpool2d", "gemm", "add", "softmax"}

// WeightsName is the name of the [[weights]] (digits.safetensors) the
// session must list; the stage looks its tensors up as
// "digits/<tensor>".
const WeightsName = "digits"

// Tensors are the weights' tensor names and shapes (float32): a tensor
// missing from the weights is NOT_FOUND at the first call, one of another
// shape or dtype INVALID_ARGUMENT naming it.
var Tensors = []struct {
	Name string
	Dims []int
}{
	{"conv1.weight", []int{C1, 1, 3, 3}},
	{"conv1.bias", []int{C1}},
	{"conv2.weight", []int{C2, C1, 3, 3}},
	{"conv2.bias", []int{C2}},
	{"dense.weight", []int{Classes, C2 * 4}},
	{"dense.bias", []int{Classes}},
}

// The work buffer, per image (float32 offsets; each region holds
// MaxImages images).
const (
	perX  = Pixels
	perC1 = C1 * 8 * 8
	perP1 = C1 * 4 * 4
	perC2 = C2 * 4 * 4
	perP2 = C2 * 2 * 2
	wX    = 0
	wC1   = wX + MaxImages*perX
	wP1   = wC1 + MaxImages*perC1
	wC2   = wP1 + MaxImages*perP1
	wP2   = wC2 + MaxImages*perC2
	wLog  = wP2 + MaxImages*perP2
	wProb = wLog + MaxImages*Classes
	nWork = wProb + MaxImages*Classes
)

// WorkBytes is the device memory one instance allocates for its
// activations, charged to the session's budget (the weights are charged
// to the device, once).
const WorkBytes = 4 * nWork

type instance struct {
	s0      stagehost.Stream
	work    stagehost.Buffer
	weights map[string]stagehost.Tensor
	n       int // the batch size net was built for
	net     []stagehost.Command
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
	weights, err := loadWeights()
	if err != nil {
		return nil, err
	}
	for _, t := range Tensors {
		if w := weights[t.Name]; w.Type != stagehost.DTypeF32 || !sameDims(w.Dims, t.Dims) {
			return nil, &tensorError{t.Name, w, t.Dims}
		}
	}
	work, err := c.AllocNamed("digits.work", WorkBytes)
	if err != nil {
		return nil, err
	}
	inst = &instance{s0: s0, work: work, weights: weights}
	return inst, nil
}

func sameDims(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// build returns the network's launches for a batch of n images.
func (st *instance) build(n int) ([]stagehost.Command, error) {
	if st.n == n {
		return st.net, nil
	}
	w := func(off int, dims ...int) stagehost.Tensor {
		return stagehost.NewTensor(st.work, 4*off, stagehost.DTypeF32, dims...)
	}
	p := st.weights
	x := w(wX, n, 1, 8, 8)
	c1, p1 := w(wC1, n, C1, 8, 8), w(wP1, n, C1, 4, 4)
	c2, p2 := w(wC2, n, C2, 4, 4), w(wP2, n, C2, 2, 2)
	logits, probs := w(wLog, n, Classes), w(wProb, n, Classes)
	pad1 := stagehost.ConvOpts{Pad: [2]int{1, 1}}
	var o stagehost.Ops
	o.Conv2d(x, p["conv1.weight"], p["conv1.bias"], c1, pad1).
		Launch("relu", c1.Arg()).
		Maxpool2d(c1, p1, [2]int{2, 2}, [2]int{2, 2}, [2]int{}).
		Conv2d(p1, p["conv2.weight"], p["conv2.bias"], c2, pad1).
		Launch("relu", c2.Arg()).
		Maxpool2d(c2, p2, [2]int{2, 2}, [2]int{2, 2}, [2]int{}).
		Gemm(p2.Reshape(n, C2*4), p["dense.weight"], logits, stagehost.GemmOpts{TransB: true}).
		Add(logits, p["dense.bias"], logits).
		Softmax(logits, probs, 0)
	if err := o.Err(); err != nil {
		return nil, err
	}
	st.n, st.net = n, append([]stagehost.Command(nil), o.Commands()...)
	return st.net, nil
}

// Run is the stage: the class probabilities of a batch of images.
func Run(c *stagehost.Call) error {
	in := c.Input()
	n := len(in) / ImageSize
	if len(in) == 0 || len(in)%ImageSize != 0 || n > MaxImages {
		return &inputError{len(in)}
	}
	st, err := setup(c)
	if err != nil {
		return err
	}
	net, err := st.build(n)
	if err != nil {
		return err
	}
	s := st.s0
	out := make([]byte, n*ResultSize)
	err = s.Write(st.work, 4*wX, in)
	if err == nil {
		err = s.SubmitBatch(net...) // the whole network: one batch
	}
	if err == nil {
		err = s.Read(st.work, 4*wProb, out) // the call's one wait
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
	return c.Write(out)
}

type tensorError struct {
	name string
	got  stagehost.Tensor
	want []int
}

func (e *tensorError) Error() string {
	return "digits: tensor " + WeightsName + "/" + e.name + " is " + dimsString(e.got.Dims) + " of dtype " +
		strconv.Itoa(int(e.got.Type)) + ", want " + dimsString(e.want) + " float32 (dtype 0)"
}

func (e *tensorError) Unwrap() error { return stagehost.ErrInvalidArgument }

func dimsString(d []int) string {
	s := "["
	for i, v := range d {
		if i > 0 {
			s += ", "
		}
		s += strconv.Itoa(v)
	}
	return s + "]"
}

type inputError struct{ n int }

func (e *inputError) Error() string {
	return "digits: input must be 1 to " + strconv.Itoa(MaxImages) + " images of " + strconv.Itoa(ImageSize) +
		" bytes (64 float32), got " + strconv.Itoa(e.n) + " bytes"
}

func (e *inputError) Unwrap() error { return stagehost.ErrInvalidArgument }

// loadWeights looks the network's tensors up in the weights called
// WeightsName, which the session must list (tensor_get): read-only
// views of the one device copy every instance on the device shares.
func loadWeights() (map[string]stagehost.Tensor, error) {
	ts := make(map[string]stagehost.Tensor, len(Tensors))
	for _, t := range Tensors {
		w, err := stagehost.LookupTensor(WeightsName + "/" + t.Name)
		if err != nil {
			return nil, err
		}
		ts[t.Name] = w
	}
	return ts, nil
}
