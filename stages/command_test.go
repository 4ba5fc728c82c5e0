package stages_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// commandGuest is a Go guest with the ABI v1 exports, as an author who
// forgets -buildmode=c-shared builds it: a WASI command.
const commandGuest = `package main

//go:wasmexport stagehost_abi_v1
func marker() {}

//go:wasmexport stagehost_run
func run() int32 { return 0 }

func main() {}
`

// TestValidateRefusesGoCommand builds a Go guest without
// -buildmode=c-shared (it exports _start, not _initialize, and imports the
// Go runtime's WASI functions) and checks that Validate, what `stagehost
// check` runs, refuses it and names the build fix: the host would never
// start its runtime, and its first call would trap in
// runtime.notInitialized.
func TestValidateRefusesGoCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go guest")
	}
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod":  "module command\n\ngo 1.24\n",
		"main.go": commandGuest,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "command.wasm")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOWORK=off", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	err = stages.Validate(bin, stages.NewLoadConfig().WithName("cmd").WithWASI(stages.GrantGoRuntime))
	if err == nil {
		t.Fatal("Validate accepted a Go command")
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error class: %v", err)
	}
	for _, want := range []string{"exports _start", "WASI command", "build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
