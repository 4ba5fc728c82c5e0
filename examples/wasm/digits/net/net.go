// Package net is the digits example's stage logic: a small CNN trained on
// scikit-learn's 8×8 digits (../train.py), run with the device op library
// only. No value is computed on the guest's CPU: a call uploads a batch
// of images, submits the whole network for the batch as one
// stream_submit_batch (each layer one launch over every image) and reads
// the probabilities back, which is the call's only wait.
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
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/stagehost/stagehost/examples/wasm/digits"
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

// Tensors are the weights' tensor names (in digits.safetensors) and their
// shapes.
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
// activations (the weights come on top).
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
	weights, err := loadWeights(c, s0)
	if err != nil {
		return nil, err
	}
	for _, t := range Tensors {
		w, ok := weights[t.Name]
		if !ok {
			return nil, fmt.Errorf("digits: no tensor %q in the weights: %w", t.Name, stagehost.ErrInvalidArgument)
		}
		if w.Type != stagehost.DTypeF32 || !sameDims(w.Dims, t.Dims) {
			return nil, fmt.Errorf("digits: tensor %q is %v of type %d, want %v float32: %w", t.Name, w.Dims, w.Type, t.Dims, stagehost.ErrInvalidArgument)
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

type inputError struct{ n int }

func (e *inputError) Error() string {
	return "digits: input must be 1 to " + strconv.Itoa(MaxImages) + " images of " + strconv.Itoa(ImageSize) +
		" bytes (64 float32), got " + strconv.Itoa(e.n) + " bytes"
}

func (e *inputError) Unwrap() error { return stagehost.ErrInvalidArgument }

// loadWeights uploads the embedded digits.safetensors' data section to a
// named buffer on s0 and returns its tensors.
func loadWeights(c *stagehost.Call, s0 stagehost.Stream) (map[string]stagehost.Tensor, error) {
	f := digits.Safetensors
	if len(f) < 8 {
		return nil, errors.New("digits: weights file too short")
	}
	hlen := binary.LittleEndian.Uint64(f)
	if hlen > uint64(len(f)-8) {
		return nil, errors.New("digits: weights header length past the file's end")
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(f[8:8+hlen], &header); err != nil {
		return nil, fmt.Errorf("digits: weights header: %w", err)
	}
	data := f[8+hlen:]
	buf, err := c.AllocNamed("digits.weights", len(data))
	if err != nil {
		return nil, err
	}
	if err := s0.Write(buf, 0, data); err != nil {
		return nil, err
	}
	ts := map[string]stagehost.Tensor{}
	for name, raw := range header {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			DType   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("digits: tensor %q: %w", name, err)
		}
		if t.DType != "F32" {
			continue
		}
		ts[name] = stagehost.NewTensor(buf, t.Offsets[0], stagehost.DTypeF32, t.Shape...)
	}
	return ts, nil
}
