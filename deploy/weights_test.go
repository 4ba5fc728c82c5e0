package deploy_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/safetensors"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// weightsManifest: the session "classify" lists the weights "digits"
// and has four instances on one sim device, reset every call.
const weightsManifest = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "weights"
path = "@REPO@/stages/testdata/abi/weights.wasm"
sha256 = "@SHA:stages/testdata/abi/weights.wasm@"
[[module]]
name = "other"
path = "@REPO@/stages/testdata/hostile/good_stage.wasm"
sha256 = "@SHA:stages/testdata/hostile/good_stage.wasm@"
[[weights]]
name = "digits"
path = "@WEIGHTS@"
sha256 = "@WEIGHTS_SHA@"
[[session]]
name = "classify"
stage = "weights"
device = "gpu0"
instances = 4
reset = "call"
programs = ["copy"]
weights = ["digits"]
`

// weightsFile writes a safetensors file of one U8 tensor "w" of n bytes
// (0, 1, 2, ...) into dir.
func weightsFile(t *testing.T, dir string, n int) (path string, data []byte) {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	data = safetensors.Encode([]safetensors.Data{{Name: "w", DType: "U8", Shape: []uint64{uint64(n)}, Bytes: b}}, nil)
	path = filepath.Join(dir, "digits.safetensors")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func weightsDeployment(t *testing.T, n int) (*deploy.Deployment, *manifest.Manifest, string) {
	t.Helper()
	path, data := weightsFile(t, t.TempDir(), n)
	body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
	body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
	body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(t, "stages/testdata/abi/weights.wasm"))
	m, err := manifest.Load(writeManifest(t, body))
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d, m, path
}

// TestWeightsOneCopyPerDevice: four instances of a session share one
// device copy of its weights: the device budget holds the data section
// once, and it was uploaded once.
func TestWeightsOneCopyPerDevice(t *testing.T) {
	const n = 1 << 20
	d, _, _ := weightsDeployment(t, n)
	if got := d.DeviceBudget("gpu0").Used(); got != n {
		t.Fatalf("device budget used %d bytes, want %d (one copy)", got, n)
	}
	if _, bytes := d.Device("gpu0").(*sim.Device).Uploads(); bytes != n {
		t.Fatalf("%d bytes uploaded, want %d", bytes, n)
	}
	if st := d.Pool("classify").Status(); st.BudgetBytes != 0 {
		t.Fatalf("the instances' own budgets hold %d bytes: weights are not theirs", st.BudgetBytes)
	}
}

// TestWeightsNotReuploaded: calls of a session reset every call, a swap
// to another module and a reset of the session upload nothing, and the
// copy is still charged once.
func TestWeightsNotReuploaded(t *testing.T) {
	const n = 64 << 10
	d, _, _ := weightsDeployment(t, n)
	dev := d.Device("gpu0").(*sim.Device)
	before, beforeBytes := dev.Uploads()
	p := d.Pool("classify")
	for range 20 {
		out, err := p.Run(context.Background(), append([]byte{7}, "digits"...))
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 16 || string(out[8:]) != "\x00\x01\x02\x03\x04\x05\x06\x07" {
			t.Fatalf("output %x", out)
		}
	}
	if _, err := d.SwapSession(context.Background(), "classify", "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SwapSession(context.Background(), "classify", "weights"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ResetSession(context.Background(), "classify"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Run(context.Background(), append([]byte{7}, "digits"...)); err != nil {
		t.Fatal(err)
	}
	if now, nowBytes := dev.Uploads(); now != before || nowBytes != beforeBytes {
		t.Fatalf("%d uploads (%d bytes) after 21 calls, two swaps and a reset", now-before, nowBytes-beforeBytes)
	}
	if got := d.DeviceBudget("gpu0").Used(); got != n {
		t.Fatalf("device budget used %d bytes, want %d", got, n)
	}
}

// TestWeightsFreedWithTheirLastHolder: closing the deployment closes
// every instance, and the copy's charge goes with the last.
func TestWeightsFreedWithTheirLastHolder(t *testing.T) {
	d, _, _ := weightsDeployment(t, 4096)
	b := d.DeviceBudget("gpu0")
	if b.Used() != 4096 {
		t.Fatalf("used %d", b.Used())
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.Used() != 0 {
		t.Fatalf("%d bytes still charged after every holder closed", b.Used())
	}
}

// TestWeightsChangedFile: a file that no longer hashes to the manifest's
// sha256 when the deployment opens refuses the deployment, naming both
// sums.
//
// Loaded with WithWeightsHashAtUpload, where the upload's check is the
// only one, the file may even have changed before the manifest was
// read: the deployment is refused all the same.
func TestWeightsChangedFile(t *testing.T) {
	for _, atUpload := range []bool{false, true} {
		path, data := weightsFile(t, t.TempDir(), 4096)
		body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
		body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
		body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(t, "stages/testdata/abi/weights.wasm"))
		manifestPath := writeManifest(t, body)
		pinned := stages.SHA256(data)
		data[len(data)-1] ^= 1
		change := func() {
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if atUpload {
			change() // before the manifest is read: the load does not hash it
		}
		m, err := manifest.LoadWith(manifestPath, manifest.NewLoadConfig().WithWeightsHashAtUpload(atUpload))
		if err != nil {
			t.Fatal(err)
		}
		if m.Weights[0].SHA256 != pinned || m.Weights[0].HashedAtLoad == atUpload {
			t.Fatalf("atUpload %v: weights %s, hashed at load %v", atUpload, m.Weights[0].SHA256, m.Weights[0].HashedAtLoad)
		}
		if !atUpload {
			change()
		}
		_, err = deploy.Open(context.Background(), m, deploy.NewConfig())
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), stages.SHA256(data)) || !strings.Contains(err.Error(), pinned) ||
			!strings.Contains(err.Error(), path) {
			t.Fatalf("atUpload %v: err = %v, want InvalidArgument naming the file and both sums", atUpload, err)
		}
	}
}

// readBytes is the number of bytes this process has read through read
// system calls (rchar of /proc/self/io); the test skips where Linux does
// not count them.
func readBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io to count the bytes read: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no rchar in /proc/self/io")
	return 0
}

// TestWeightsReadOnceWhenHashedAtUpload: loading a manifest with
// WithWeightsHashAtUpload and opening it reads the weights file once (the
// upload, which hashes what it streams); loaded with Load, which hashes
// the file itself, it is read twice. Counted in bytes read by the
// process: a 32 MiB file dwarfs the manifest and the modules.
func TestWeightsReadOnceWhenHashedAtUpload(t *testing.T) {
	const n = 32 << 20
	path, data := weightsFile(t, t.TempDir(), n)
	body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
	body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
	body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(t, "stages/testdata/abi/weights.wasm"))
	manifestPath := writeManifest(t, body)
	for _, c := range []struct {
		atUpload bool
		reads    int64 // times the file is read
	}{{true, 1}, {false, 2}} {
		before := readBytes(t)
		m, err := manifest.LoadWith(manifestPath, manifest.NewLoadConfig().WithWeightsHashAtUpload(c.atUpload))
		if err != nil {
			t.Fatal(err)
		}
		d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
		if err != nil {
			t.Fatal(err)
		}
		read := readBytes(t) - before
		d.Close(context.Background())
		if file := int64(len(data)); read < c.reads*file || read > c.reads*file+n/2 {
			t.Errorf("atUpload %v: %d bytes read to load the manifest and open it, want the %d-byte file read %d times", c.atUpload, read, file, c.reads)
		}
	}
}

// TestWeightsProgress: an upload above 64 MiB logs a line per tenth on
// the deployment's log, 10% to 100%, and tells the progress function.
func TestWeightsProgress(t *testing.T) {
	path, data := weightsFile(t, t.TempDir(), 64<<20+8)
	body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
	body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
	body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(t, "stages/testdata/abi/weights.wasm"))
	body = strings.ReplaceAll(body, "instances = 4", "instances = 1")
	m, err := manifest.Load(writeManifest(t, body))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	var progress []string
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithLogger(logger).
		WithProgress(func(msg string) { progress = append(progress, msg) }))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "uploaded to device gpu0") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 10 || !strings.Contains(lines[0], "weights digits: 10% uploaded") || !strings.Contains(lines[9], "100% uploaded") {
		t.Fatalf("progress lines:\n%s", strings.Join(lines, "\n"))
	}
	var told []string
	for _, p := range progress {
		if strings.Contains(p, "uploaded to device gpu0") {
			told = append(told, p)
		}
	}
	if len(told) != 10 {
		t.Fatalf("progress function told:\n%s", strings.Join(progress, "\n"))
	}
}

// TestWeightsOneCopyPerDeviceOfTheSession: a session on two devices, and
// a second session on one of them, listing the same weights: one copy on
// each device, charged once to each.
func TestWeightsOneCopyPerDeviceOfTheSession(t *testing.T) {
	const n = 8192
	path, data := weightsFile(t, t.TempDir(), n)
	body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
	body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
	body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(t, "stages/testdata/abi/weights.wasm"))
	body = strings.ReplaceAll(body, `device = "gpu0"
instances = 4`, `devices = ["gpu0", "gpu1"]
instances = 4`)
	body += `
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu2"
backend = "sim"
engine = "gpu"
[[session]]
name = "second"
stage = "weights"
device = "gpu1"
weights = ["digits"]
`
	m, err := manifest.Load(writeManifest(t, body))
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	for dev, want := range map[string]int64{"gpu0": n, "gpu1": n, "gpu2": 0} {
		if b := d.DeviceBudget(dev); (b == nil && want != 0) || (b != nil && b.Used() != want) {
			t.Errorf("device %s: budget %v, want %d bytes", dev, b, want)
		}
		if _, bytes := d.Device(dev).(*sim.Device).Uploads(); int64(bytes) != want {
			t.Errorf("device %s: %d bytes uploaded, want %d", dev, bytes, want)
		}
	}
}

// BenchmarkWeightsOpen: loading a manifest with one [[weights]] file of
// STAGEHOST_WEIGHTS_MIB MiB (default 1024) and opening it on a sim
// device, which uploads it: hashed-twice is manifest.Load (the load
// hashes the file, then the upload hashes it again), hashed-once is
// manifest.LoadWith with WithWeightsHashAtUpload (only the upload hashes
// it), as run and serve load it.
//
//	go test -run '^$' -bench WeightsOpen -count 5 ./deploy/
func BenchmarkWeightsOpen(b *testing.B) {
	mib := 1024
	if s := os.Getenv("STAGEHOST_WEIGHTS_MIB"); s != "" {
		var err error
		if mib, err = strconv.Atoi(s); err != nil || mib < 1 {
			b.Fatalf("STAGEHOST_WEIGHTS_MIB=%q: want a positive integer", s)
		}
	}
	n := mib << 20
	data := safetensors.Encode([]safetensors.Data{{Name: "w", DType: "U8", Shape: []uint64{uint64(n)}, Bytes: make([]byte, n)}}, nil)
	path := filepath.Join(b.TempDir(), "digits.safetensors")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	body := strings.ReplaceAll(weightsManifest, "@WEIGHTS@", path)
	body = strings.ReplaceAll(body, "@WEIGHTS_SHA@", stages.SHA256(data))
	body = strings.ReplaceAll(body, "@SHA:stages/testdata/abi/weights.wasm@", sha(b, "stages/testdata/abi/weights.wasm"))
	manifestPath := writeManifest(b, body)
	data = nil
	quiet := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name     string
		atUpload bool
	}{{"hashed-twice", false}, {"hashed-once", true}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				m, err := manifest.LoadWith(manifestPath, manifest.NewLoadConfig().WithWeightsHashAtUpload(c.atUpload))
				if err != nil {
					b.Fatal(err)
				}
				d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithLogger(quiet))
				if err != nil {
					b.Fatal(err)
				}
				d.Close(context.Background())
			}
		})
	}
}
