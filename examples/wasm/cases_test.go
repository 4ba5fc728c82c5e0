package wasm_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/safetensors"
	"github.com/stagehost/stagehost/stages"
)

// sharedCase is one case of guest-sdk/testdata/emucases.txt: the session
// it declares, its call lines, and the outcome they must give.
type sharedCase struct {
	name     string
	line     int
	body     strings.Builder
	streams  []string
	buffers  map[string]int
	programs []string
	weights  []caseWeights
	budget   int64
	outlimit int
	input    []byte
	outcome  string
	output   []byte
	hasOut   bool
	fence    bool // the module's fence runs the case's fence lines
}

// caseWeights is one weights or safetensors line of a case.
type caseWeights struct {
	name        string
	data        []byte
	safetensors bool
}

// upload puts w on dev as the host does for a manifest's [[weights]].
func (w caseWeights) upload(t *testing.T, f *fixture) *stages.Weights {
	t.Helper()
	cfg, data := stages.NewWeightsConfig(w.name, int64(len(w.data))), w.data
	if w.safetensors {
		h, err := safetensors.ReadHeader(bytes.NewReader(w.data), int64(len(w.data)))
		if err != nil {
			t.Fatalf("weights %s: %v", w.name, err)
		}
		tensors := map[string]stages.WeightsTensor{}
		for _, tn := range h.Tensors {
			tensors[tn.Name] = stages.WeightsTensor{Offset: tn.Begin, Bytes: tn.End - tn.Begin, DType: tn.Code, Dims: tn.Shape}
		}
		cfg, data = stages.NewWeightsConfig(w.name, h.DataSize).WithTensors(tensors), w.data[h.DataOffset:]
	}
	up, err := stages.UploadWeights(context.Background(), f.gpu, cfg, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("weights %s: %v", w.name, err)
	}
	return up
}

func parseSharedCases(t *testing.T, path string) []*sharedCase {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []*sharedCase
	var cur *sharedCase
	for n, raw := range strings.Split(string(b), "\n") {
		l := strings.TrimSpace(raw)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		kw, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		if kw == "case" {
			cur = &sharedCase{name: rest, line: n + 1, buffers: map[string]int{}, outcome: "ok"}
			continue
		}
		if cur == nil {
			t.Fatalf("%s:%d: %q outside a case", path, n+1, l)
		}
		num := func(s string) int {
			v, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, n+1, err)
			}
			return v
		}
		unhex := func(s string) []byte {
			v, err := hex.DecodeString(s)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, n+1, err)
			}
			return v
		}
		switch kw {
		case "end":
			cases = append(cases, cur)
			cur = nil
		case "stream":
			cur.streams = append(cur.streams, rest)
		case "buffer":
			name, size, _ := strings.Cut(rest, " ")
			cur.buffers[name] = num(size)
		case "program":
			cur.programs = append(cur.programs, rest)
		case "weights", "safetensors":
			name, data, _ := strings.Cut(rest, " ")
			cur.weights = append(cur.weights, caseWeights{name: name, data: unhex(data), safetensors: kw == "safetensors"})
		case "budget":
			cur.budget = int64(num(rest))
		case "outlimit":
			cur.outlimit = num(rest)
		case "input":
			cur.input = unhex(rest)
		case "outcome":
			cur.outcome = rest
		case "output":
			cur.output, cur.hasOut = unhex(rest), true
		case "call", "lasterr", "return", "fence":
			cur.fence = cur.fence || kw == "fence"
			cur.body.WriteString(l + "\n")
		default:
			t.Fatalf("%s:%d: unknown item %q", path, n+1, kw)
		}
	}
	if cur != nil {
		t.Fatalf("%s: case %s has no end", path, cur.name)
	}
	return cases
}

// TestSharedCasesOnTheHost runs guest-sdk/testdata/emucases.txt on the
// real host (the sim backend), through casestage.wasm, a Rust stage that
// interprets each case's calls (and, where the case has fence lines, is
// the session's fence): the table the Go, Rust and C emulators
// run, so that all four agree on every status, out-value, last error and
// outcome.
func TestSharedCasesOnTheHost(t *testing.T) {
	cases := parseSharedCases(t, "../../guest-sdk/testdata/emucases.txt")
	if len(cases) < 19 {
		t.Fatalf("only %d cases", len(cases))
	}
	f := newFixture(t)
	m := load(t, "../../guest-sdk/testdata/casestage/casestage.wasm", "casestage", stages.NewLoadConfig())
	ctx := context.Background()
	// A fence that returns without waiting ("fence ok") lies only while
	// its session's work is still running when the host checks the
	// streams. The emulators defer device work until a sync, so it always
	// is there; the simulator runs it at once, so such a case gets a
	// device whose commands take 2 s each, and the check cannot come
	// after the work.
	slowP := sim.New()
	t.Cleanup(func() { slowP.Close() })
	slow, err := slowP.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		dev := f.gpu
		if strings.Contains(c.body.String(), "\nfence ok\n") || strings.HasPrefix(c.body.String(), "fence ok\n") {
			dev = slow
		}
		cfg := stages.NewSessionConfig("case-"+c.name, dev).WithStreams(c.streams...).WithPrograms(c.programs...)
		for name, size := range c.buffers {
			cfg = cfg.WithBuffer(name, size)
		}
		if c.budget > 0 {
			cfg = cfg.WithBudget(c.budget)
		}
		if c.outlimit > 0 {
			cfg = cfg.WithOutputLimit(c.outlimit)
		}
		for _, w := range c.weights {
			up := w.upload(t, f)
			defer up.Release()
			cfg = cfg.WithWeights(up)
		}
		if !c.fence {
			cfg = cfg.WithDrainFence() // the built-in fence, not casestage's
		}
		s, err := engine(t).NewSession(ctx, f.rt, m, cfg)
		if err != nil {
			t.Errorf("case %s (line %d): %v", c.name, c.line, err)
			continue
		}
		if _, err := s.RunEntry(ctx, "load", []byte(c.body.String()), nil); err != nil {
			t.Fatalf("case %s: load: %v", c.name, err)
		}
		out, err := s.RunEntry(ctx, "main", c.input, nil)
		var ce *stages.ClientError
		switch {
		case c.outcome == "ok":
			if err != nil || (c.hasOut && string(out) != string(c.output)) {
				t.Errorf("case %s (line %d): want ok with output %x, got %x, %v", c.name, c.line, c.output, out, err)
			}
		case c.outcome == "fault":
			if !errors.Is(err, errdefs.ErrFault) || errors.As(err, &ce) {
				t.Errorf("case %s (line %d): want a device fault, got %v", c.name, c.line, err)
			}
		case c.outcome == "quarantined":
			if !errors.Is(err, errdefs.ErrDeviceLost) || s.Quarantined() == nil {
				t.Errorf("case %s (line %d): want the session quarantined, got %v", c.name, c.line, err)
			}
		case strings.HasPrefix(c.outcome, "client "):
			want, _ := strconv.Atoi(strings.TrimPrefix(c.outcome, "client "))
			if !errors.As(err, &ce) || int(ce.Code) != want {
				t.Errorf("case %s (line %d): want client error %d, got %v", c.name, c.line, want, err)
			}
		default:
			t.Fatalf("case %s: unknown outcome %q", c.name, c.outcome)
		}
		// A quarantined session's close reports the quarantine.
		if err := s.Close(ctx); err != nil && c.outcome != "quarantined" {
			t.Errorf("case %s: close: %v", c.name, err)
		}
	}
}
