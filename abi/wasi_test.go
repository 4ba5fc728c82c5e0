package abi

import (
	"context"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// TestWASISignaturesMatchTheEngine compares WASISignatures with the types
// of the WASI functions the engine actually provides, so a granted import
// checked at load also links.
func TestWASISignaturesMatchTheEngine(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		t.Fatal(err)
	}
	defs := r.Module(WASIModule).ExportedFunctionDefinitions()
	if len(WASISignatures) != len(GoRuntimeWASI) {
		t.Fatalf("%d signatures for %d grantable functions", len(WASISignatures), len(GoRuntimeWASI))
	}
	for _, name := range GoRuntimeWASI {
		sig, ok := WASISignatures[name]
		if !ok {
			t.Errorf("%s: no signature", name)
			continue
		}
		d, ok := defs[name]
		if !ok {
			t.Errorf("%s: the engine has no such WASI function", name)
			continue
		}
		if !slices.Equal(d.ParamTypes(), sig.Params) || !slices.Equal(d.ResultTypes(), sig.Results) {
			t.Errorf("%s: engine type %v -> %v, WASISignatures says %v -> %v", name, d.ParamTypes(), d.ResultTypes(), sig.Params, sig.Results)
		}
	}
}
