package safetensors

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the guest SDK's copy of safetensors.go")

// sdkCopyHeader starts the guest SDK's copy of safetensors.go.
const sdkCopyHeader = `// Code copied from the host's internal/safetensors/safetensors.go by
// TestSDKCopyIsCurrent (go test ./internal/safetensors -update); DO NOT
// EDIT. The SDK is a module of its own and imports nothing of the
// host's; its errors.go is its own.

`

// TestSDKCopyIsCurrent: the guest SDK's emulator reads safetensors files
// with a copy of this reader (its module cannot import the host's); the
// copy is this package's safetensors.go byte for byte after a header, so
// that the emulator refuses exactly the headers the host refuses. Only
// errors.go differs.
func TestSDKCopyIsCurrent(t *testing.T) {
	src, err := os.ReadFile("safetensors.go")
	if err != nil {
		t.Fatal(err)
	}
	want := sdkCopyHeader + string(src)
	path := filepath.Join("..", "..", "guest-sdk", "internal", "safetensors", "safetensors.go")
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not internal/safetensors/safetensors.go: run go test ./internal/safetensors -update", path)
	}
}
