// Package model is the reference for the mlp example stage: a tiny MLP
// classifier, 8 inputs → 16 hidden (ReLU) → 4 classes, with deterministic
// weights generated from a fixed integer recipe. Forward computes in
// float32 in exactly the order the device kernels do (matmul sums from 0
// over k in order, products rounded to float32 before adding; bias; relu;
// first-largest argmax), so the stage's output and the reference agree bit
// for bit.
//
// The stage (../stage) uploads Params and runs matmul → bias → relu →
// matmul → bias → argmax on stream "s0", or all six as one mlp_forward
// launch. No dependencies, so host-side tests import this package too.
package model

import (
	"encoding/binary"
	"errors"
	"math"
)

// Shapes.
const (
	Inputs  = 8
	Hidden  = 16
	Classes = 4
)

// Layout of the parameter vector (in float32 values): W1 (Inputs×Hidden,
// row-major), b1 (Hidden), W2 (Hidden×Classes, row-major), b2 (Classes).
const (
	OffW1     = 0
	OffB1     = OffW1 + Inputs*Hidden
	OffW2     = OffB1 + Hidden
	OffB2     = OffW2 + Hidden*Classes
	NumParams = OffB2 + Classes
)

// Sizes of the stage's input and output in bytes.
const (
	// InputSize: Inputs float32 values, little-endian.
	InputSize = 4 * Inputs
	// OutputSize: the class as a little-endian uint32, then Classes float32
	// scores, little-endian.
	OutputSize = 4 + 4*Classes
)

// Param is parameter i: float32((i*37+11)%97-48)/64, in [-0.75, 0.75].
func Param(i int) float32 { return float32((i*37+11)%97-48) / 64 }

// Params returns every parameter in layout order.
func Params() []float32 {
	p := make([]float32, NumParams)
	for i := range p {
		p[i] = Param(i)
	}
	return p
}

// ParamBytes returns Params as little-endian float32 bytes, as uploaded to
// the device.
func ParamBytes() []byte {
	b := make([]byte, 0, 4*NumParams)
	for i := range NumParams {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(Param(i)))
	}
	return b
}

// Forward classifies x: the index of the first largest score, and the
// scores.
func Forward(x [Inputs]float32) (class int, scores [Classes]float32) {
	p := Params()
	var h [Hidden]float32
	for j := range Hidden {
		var sum float32
		for k := range Inputs {
			sum += float32(x[k] * p[OffW1+k*Hidden+j])
		}
		h[j] = sum
	}
	for j := range Hidden {
		h[j] += p[OffB1+j]
		if h[j] < 0 {
			h[j] = 0
		}
	}
	for j := range Classes {
		var sum float32
		for k := range Hidden {
			sum += float32(h[k] * p[OffW2+k*Classes+j])
		}
		scores[j] = sum + p[OffB2+j]
	}
	best := 0
	for j := 1; j < Classes; j++ {
		if scores[j] > scores[best] {
			best = j
		}
	}
	return best, scores
}

// EncodeInput is the stage's input for x.
func EncodeInput(x [Inputs]float32) []byte {
	b := make([]byte, 0, InputSize)
	for _, v := range x {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// EncodeOutput is the stage's output for a class and its scores.
func EncodeOutput(class int, scores [Classes]float32) []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, OutputSize), uint32(class))
	for _, v := range scores {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// DecodeOutput splits a stage output into the class and the scores.
func DecodeOutput(b []byte) (class int, scores [Classes]float32, err error) {
	if len(b) != OutputSize {
		return 0, scores, errors.New("model: output is not 20 bytes")
	}
	for i := range scores {
		scores[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4+4*i:]))
	}
	return int(binary.LittleEndian.Uint32(b)), scores, nil
}

// Predict is the reference for a whole stage call: the output the stage
// must write for input, or an error for an input that is not InputSize
// bytes.
func Predict(input []byte) ([]byte, error) {
	if len(input) != InputSize {
		return nil, errors.New("model: input is not 32 bytes")
	}
	var x [Inputs]float32
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(input[4*i:]))
	}
	class, scores := Forward(x)
	return EncodeOutput(class, scores), nil
}

// TestInputs returns n deterministic inputs spread over [-2, 2), for tests
// on either side of the ABI.
func TestInputs(n int) [][Inputs]float32 {
	xs := make([][Inputs]float32, n)
	for i := range xs {
		for k := range Inputs {
			xs[i][k] = float32((i*131+k*29+7)%64-32) / 16
		}
	}
	return xs
}

// RoundingInputs returns n deterministic inputs in [-4, 4) with 24
// significant bits each. Unlike TestInputs (multiples of 1/16, whose
// products with the weights are exact in float32), their products round,
// so a fused multiply-add or another summation order changes the scores:
// they check bit-identity for real.
func RoundingInputs(n int) [][Inputs]float32 {
	xs := make([][Inputs]float32, n)
	seed := uint32(12345)
	for i := range xs {
		for k := range Inputs {
			seed = seed*1664525 + 1013904223
			xs[i][k] = float32(int32(seed)) / (1 << 29)
		}
	}
	return xs
}
