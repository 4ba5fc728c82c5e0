// Package digits holds the digits example's trained weights
// (digits.safetensors, written by train.py) for the stage and its tests.
package digits

import _ "embed"

// Safetensors is digits.safetensors: the trained weights.
//
//go:embed digits.safetensors
var Safetensors []byte
