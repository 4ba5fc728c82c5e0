package model

import (
	"bytes"
	"os"
	"testing"
)

// The manifest's sample input is the first test input, encoded.
func TestSampleInputFileIsTheFirstTestInput(t *testing.T) {
	want := EncodeInput(TestInputs(1)[0])
	got, err := os.ReadFile("../../../inputs/mlp-sample.bin")
	if os.Getenv("STAGEHOST_WRITE_SAMPLE") == "1" {
		if err := os.WriteFile("../../../inputs/mlp-sample.bin", want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("examples/inputs/mlp-sample.bin is stale (%v); regenerate with STAGEHOST_WRITE_SAMPLE=1 go test ./examples/wasm/mlp/model", err)
	}
}
