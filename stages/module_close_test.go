package stages

import (
	"context"
	"testing"
)

// TestModuleCloseForgetsTheModule: a closed module is forgotten by the
// engine (loading the bytes again compiles a new one, which serves), and
// closing it twice does nothing.
func TestModuleCloseForgetsTheModule(t *testing.T) {
	ctx := context.Background()
	e, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	bin := hostile(t, "good_stage")
	cfg := NewLoadConfig().WithName("good")
	m1, err := e.Load(ctx, bin, SHA256(bin), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := e.Load(ctx, bin, SHA256(bin), cfg); again != m1 {
		t.Fatal("the same load did not return the same module")
	}
	if err := m1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m1.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	m2, err := e.Load(ctx, bin, SHA256(bin), cfg)
	if err != nil || m2 == m1 {
		t.Fatalf("after Close, Load = %p, %v; want a new module", m2, err)
	}
}
