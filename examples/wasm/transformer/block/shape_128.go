//go:build block128

package block

// The benchmark's shape (transformer128.wasm, built with -tags block128).
const (
	S = 128 // sequence length
	D = 512 // width
	H = 8   // heads
)
