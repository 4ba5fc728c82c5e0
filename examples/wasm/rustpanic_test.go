package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRustPanicLogsAndTraps: a panic in a Rust stage built with the SDK's
// std feature logs its message through the host (level error), then the
// module traps: the call fails with Fault, and the next call runs on a new
// instance.
func TestRustPanicLogsAndTraps(t *testing.T) {
	var logs syncBuffer
	eng, err := stages.NewEngine(context.Background(), stages.NewEngineConfig().
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background())
	f := newFixture(t)
	bin, err := os.ReadFile("../../guest-sdk/testdata/casestage/casestage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(context.Background(), bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("casestage"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := eng.NewSession(context.Background(), f.rt, m, stages.NewSessionConfig("panics", f.gpu))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	_, err = s.RunEntry(context.Background(), "panic", nil, nil)
	var ce *stages.ClientError
	if !errors.Is(err, errdefs.ErrFault) || errors.As(err, &ce) {
		t.Fatalf("a panicking stage: %v, want a trap (Fault)", err)
	}
	if got := logs.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "panicked at 'casestage: a deliberate panic'") {
		t.Errorf("the panic's message is not in the guest log:\n%s", got)
	}
	// The instance was replaced: the next call runs.
	if _, err := s.RunEntry(context.Background(), "load", []byte("call input_size => OK 0\n"), nil); err != nil {
		t.Fatalf("after the trap: %v", err)
	}
	if _, err := s.RunEntry(context.Background(), "main", nil, nil); err != nil {
		t.Fatalf("after the trap: %v", err)
	}
}
