package cuda

import (
	"bytes"
	"context"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/stages"
)

// TestFakeWeightsUploadThroughPinnedStaging: stages.UploadWeights on a
// CUDA device uploads in chunks, every copy from pinned (cuMemHostAlloc)
// staging memory; the device copy is the file's bytes, charged once and
// released with the last reference.
func TestFakeWeightsUploadThroughPinnedStaging(t *testing.T) {
	p, f := newFakePlatform(t, 1)
	dev := p.Devices()[0]
	data := make([]byte, 40<<10+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	budget := hw.NewBudget("device cuda0", 0)
	htod, pinned := f.htod.Load(), f.htodPinned.Load()
	w, err := stages.UploadWeights(context.Background(), dev, stages.NewWeightsConfig("w", int64(len(data))).
		WithChunk(8<<10).WithBudget(budget).WithSHA256(stages.SHA256(data)), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if n, np := f.htod.Load()-htod, f.htodPinned.Load()-pinned; n != 6 || np != 6 {
		t.Fatalf("%d uploads, %d from pinned memory; want 6 chunks, all pinned", n, np)
	}
	if budget.Used() != int64(len(data)) {
		t.Fatalf("budget %d", budget.Used())
	}
	r := newRig(t, p)
	got := make([]byte, len(data))
	c, err := r.s.Read(w.Buffer(), 0, got)
	if err == nil {
		err = c.Wait(r.ctx)
	}
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the device copy differs from the file (%v)", err)
	}
	w.Release()
	if budget.Used() != 0 {
		t.Fatalf("%d bytes charged after the last reference went", budget.Used())
	}
}
