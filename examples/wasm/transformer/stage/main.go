// Command stage is the transformer example: one transformer block built
// from the device op library (see package block).
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o transformer.wasm .
package main

import (
	"github.com/stagehost/stagehost/examples/wasm/transformer/block"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

func init() { stagehost.Main(block.Run) }

func main() {}
