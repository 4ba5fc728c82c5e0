// Command stage is the digits example: a CNN trained on scikit-learn's
// 8×8 digits, run with the device op library (see package net).
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o digits.wasm .
package main

import (
	"github.com/stagehost/stagehost/examples/wasm/digits/net"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

func init() { stagehost.Main(net.Run) }

func main() {}
