// Command stage is the CNN example: a small image classifier built from
// the device op library (see package net).
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o cnn.wasm .
package main

import (
	"github.com/stagehost/stagehost/examples/wasm/cnn/net"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

func init() { stagehost.Main(net.Run) }

func main() {}
