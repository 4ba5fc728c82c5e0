// Package weightsload benchmarks loading weights onto a device
// (stages.UploadWeights, what a deployment does once per device for a
// [[weights]] table): a generated safetensors file of
// STAGEHOST_WEIGHTS_MIB MiB (default 1024) read as a stream through two
// 8 MiB host-visible (on CUDA: pinned) staging buffers, hashed and
// uploaded. It reports the time, the throughput and the peak resident
// memory the load added (VmHWM of /proc/self/status, reset before each
// sub-benchmark through /proc/self/clear_refs), against a plain pinned
// copy of the same bytes from Go: one cuMemcpyHtoDAsync (Stream.Write)
// from a pinned host buffer already holding them.
//
// On sim the device copy is itself host memory, so the resident memory
// the load adds includes the copy (the file's size); on CUDA it should be
// the two staging buffers and little more. Without a GPU the CUDA
// sub-benchmarks skip (STAGEHOST_REQUIRE_GPU=1 fails them instead).
// bench/cuda/weights.sh runs them on the GPU machine from a pre-built
// test binary and writes a table.
package weightsload

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/safetensors"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/stages"
)

// weightsFile is the generated file, made once per process.
type weightsFile struct {
	path      string
	sum       string
	header    []byte
	dataBytes int64
}

var generated *weightsFile

// sizeMiB is the data section's size in MiB.
func sizeMiB(tb testing.TB) int64 {
	if s := os.Getenv("STAGEHOST_WEIGHTS_MIB"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			tb.Fatalf("STAGEHOST_WEIGHTS_MIB=%q: want a positive integer", s)
		}
		return n
	}
	return 1024
}

// file writes a safetensors file of one U8 tensor of sizeMiB MiB of
// pseudo-random bytes into a temporary directory (STAGEHOST_WEIGHTS_DIR,
// default the system's), once.
func file(tb testing.TB) *weightsFile {
	tb.Helper()
	if generated != nil {
		return generated
	}
	n := sizeMiB(tb) << 20
	dir, err := os.MkdirTemp(os.Getenv("STAGEHOST_WEIGHTS_DIR"), "weights-*")
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, "weights.safetensors")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	header := safetensors.EncodeHeader([]safetensors.Tensor{{Name: "w", DType: "U8", Shape: []uint64{uint64(n)}, Begin: 0, End: uint64(n)}}, nil)
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	w.Write(header)
	chunk := make([]byte, 1<<20)
	x := uint64(0x9e3779b97f4a7c15)
	for done := int64(0); done < n; done += int64(len(chunk)) {
		for i := 0; i < len(chunk); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			for k := range 8 {
				chunk[i+k] = byte(x >> (8 * k))
			}
		}
		w.Write(chunk)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	generated = &weightsFile{path: path, sum: hex.EncodeToString(h.Sum(nil)), header: header, dataBytes: n}
	return generated
}

// TestMain removes the generated file.
func TestMain(m *testing.M) {
	code := m.Run()
	if generated != nil {
		os.RemoveAll(filepath.Dir(generated.path))
	}
	os.Exit(code)
}

// resetPeak resets the process's VmHWM to its current RSS (Linux 4.0 and
// later); false where it cannot.
func resetPeak() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// status reads a kB field of /proc/self/status, in bytes.
func status(tb testing.TB, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	tb.Skipf("no %s in /proc/self/status", field)
	return 0
}

// load uploads the file's data section to dev as stages.UploadWeights
// does for a deployment, and frees the copy.
func load(b *testing.B, dev hw.Device, wf *weightsFile) {
	f, err := os.Open(wf.path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(int64(len(wf.header)), io.SeekStart); err != nil {
		b.Fatal(err)
	}
	cfg := stages.NewWeightsConfig("bench", wf.dataBytes).WithSHA256(wf.sum).WithHashPrefix(wf.header)
	w, err := stages.UploadWeights(context.Background(), dev, cfg, f)
	if err != nil {
		b.Fatal(err)
	}
	w.Release()
}

// measure runs fn b.N times and reports MB/s (SetBytes) and the peak
// resident memory it added, in MiB.
func measure(b *testing.B, bytes int64, fn func()) {
	b.SetBytes(bytes)
	hwmOK := resetPeak()
	before := status(b, "VmRSS")
	b.ResetTimer()
	for range b.N {
		fn()
	}
	b.StopTimer()
	if hwmOK {
		b.ReportMetric(float64(status(b, "VmHWM")-before)/(1<<20), "peak-rss-added-MiB")
	}
}

// pinnedCopy uploads the same bytes from a pinned (host-visible) buffer
// that already holds them: one Stream.Write, the baseline.
func pinnedCopy(b *testing.B, dev hw.Device, wf *weightsFile) {
	n := int(wf.dataBytes)
	host, err := dev.Alloc(n, hw.AllocHostVisible, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer host.Free()
	hb, err := host.HostBytes()
	if err != nil {
		b.Skipf("no host-visible memory on %s: %v", dev.Name(), err)
	}
	f, err := os.Open(wf.path)
	if err != nil {
		b.Fatal(err)
	}
	f.Seek(int64(len(wf.header)), io.SeekStart)
	if _, err := io.ReadFull(f, hb[:n]); err != nil {
		b.Fatal(err)
	}
	f.Close()
	dst, err := dev.Alloc(n, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Free()
	s, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	measure(b, int64(n), func() {
		if _, err := s.Write(dst, 0, hb[:n]); err != nil {
			b.Fatal(err)
		}
		if err := s.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkWeightsLoad: sim/load and, with a GPU, cuda/load (the file to
// the device: read, hashed, uploaded through pinned staging) and
// cuda/pinned-copy (the baseline: the bytes already in pinned memory, one
// copy).
func BenchmarkWeightsLoad(b *testing.B) {
	wf := file(b)
	b.Run("sim/load", func(b *testing.B) {
		p := sim.New()
		defer p.Close()
		dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
		if err != nil {
			b.Fatal(err)
		}
		measure(b, wf.dataBytes, func() { load(b, dev, wf) })
	})
	b.Run("sim/pinned-copy", func(b *testing.B) {
		p := sim.New()
		defer p.Close()
		dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
		if err != nil {
			b.Fatal(err)
		}
		pinnedCopy(b, dev, wf)
	})
	b.Run("cuda/load", func(b *testing.B) {
		p, err := cuda.Open(cuda.NewConfig())
		testutil.GPU(b, err)
		defer p.Close()
		dev, err := p.Device("cuda0")
		if err != nil {
			b.Fatal(err)
		}
		measure(b, wf.dataBytes, func() { load(b, dev, wf) })
	})
	b.Run("cuda/pinned-copy", func(b *testing.B) {
		p, err := cuda.Open(cuda.NewConfig())
		testutil.GPU(b, err)
		defer p.Close()
		dev, err := p.Device("cuda0")
		if err != nil {
			b.Fatal(err)
		}
		pinnedCopy(b, dev, wf)
	})
}

// TestWeightsLoadSmall runs a load of 1 MiB on sim everywhere, so the
// benchmark's code is checked by the ordinary test run.
func TestWeightsLoadSmall(t *testing.T) {
	t.Setenv("STAGEHOST_WEIGHTS_MIB", "1")
	p := sim.New()
	defer p.Close()
	dev, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	wf := file(t)
	defer func() { os.RemoveAll(filepath.Dir(wf.path)); generated = nil }()
	f, err := os.Open(wf.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Seek(int64(len(wf.header)), io.SeekStart)
	w, err := stages.UploadWeights(context.Background(), dev, stages.NewWeightsConfig("t", wf.dataBytes).
		WithSHA256(wf.sum).WithHashPrefix(wf.header), f)
	if err != nil {
		t.Fatal(err)
	}
	if w.Size() != 1<<20 {
		t.Fatalf("size %d", w.Size())
	}
	w.Release()
}
