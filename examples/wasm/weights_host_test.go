package wasm_test

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stagehost/stagehost/internal/safetensors"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

// TestWeightsGoGuest runs weights/weights.wasm on the host with
// weights/tiny.safetensors as the weights "tiny", and checks its report
// against weights/report.txt, which weights/main_test.go checks the
// emulator's against: the host and the emulator agree on the lookups,
// the statuses and the last errors of weights (ABI revision 3).
func TestWeightsGoGuest(t *testing.T) {
	testutil.GoGuests(t)
	f := newFixture(t)
	file, err := os.ReadFile("weights/tiny.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("weights/report.txt")
	if err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.ReadHeader(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	tensors := map[string]stages.WeightsTensor{}
	for _, tn := range h.Tensors {
		tensors[tn.Name] = stages.WeightsTensor{Offset: tn.Begin, Bytes: tn.End - tn.Begin, DType: tn.Code, Dims: tn.Shape}
	}
	w, err := stages.UploadWeights(context.Background(), f.gpu, stages.NewWeightsConfig("tiny", h.DataSize).WithTensors(tensors).
		WithSHA256(stages.SHA256(file)).WithHashPrefix(file[:h.DataOffset]), bytes.NewReader(file[h.DataOffset:]))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	m := load(t, "weights/weights.wasm", "weights", goGuest())
	s, err := engine(t).NewSession(context.Background(), f.rt, m,
		stages.NewSessionConfig("weights", f.gpu).WithStreams("s0").WithPrograms("copy").WithWeights(w))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	out, err := s.Run(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(want) {
		t.Fatalf("the host's report differs from the emulator's (weights/report.txt)\n--- host\n%s--- emulator\n%s", out, want)
	}
}
