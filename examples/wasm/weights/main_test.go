package main

import (
	"os"
	"testing"

	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// TestWeightsReport runs the stage in the emulator with tiny.safetensors
// as the weights "tiny"; examples/wasm/host_test.go runs weights.wasm on
// the host with the same file, against the same report.txt.
func TestWeightsReport(t *testing.T) {
	file, err := os.ReadFile("tiny.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("report.txt")
	if err != nil {
		t.Fatal(err)
	}
	e := emu.New(emu.NewConfig().WithSafetensors("tiny", file)).Stream("s0").Programs("copy")
	out, err := e.Run("main", nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(want) {
		t.Fatalf("report differs from report.txt\n--- got\n%s--- want\n%s", out, want)
	}
}
