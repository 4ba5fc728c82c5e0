//go:build !block128

package block

// The committed example's shape (transformer.wasm).
const (
	S = 8  // sequence length
	D = 32 // width
	H = 4  // heads
)
