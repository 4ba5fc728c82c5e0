package deploy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// ptxKernel writes ptx to a file and returns a kernel that pins it, and a
// cache whose reads of the file are counted.
func ptxKernel(t *testing.T, ptx string) (*manifest.Kernel, *vendorCache, *atomic.Int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "double.ptx")
	if err := os.WriteFile(path, []byte(ptx), 0o644); err != nil {
		t.Fatal(err)
	}
	reads := new(atomic.Int64)
	c := &vendorCache{read: func(path string, limit int64) ([]byte, error) {
		reads.Add(1)
		return manifest.ReadFile(path, limit)
	}}
	return &manifest.Kernel{Name: "double", PTXFile: path, PTXSHA256: stages.SHA256([]byte(ptx))}, c, reads
}

// TestVendorPTXReadOnceForEveryInstance: eight instances made at once
// (a session with instances = 8) read and hash the kernel's PTX once and
// get the same bytes; an instance made after the file changed on disk
// (a swap, a reload, a reset) still gets the bytes checked against the
// manifest's sha256, without reading the file again.
func TestVendorPTXReadOnceForEveryInstance(t *testing.T) {
	const ptx = ".version 8.0\n.entry double()\n{ ret; }\n"
	k, c, reads := ptxKernel(t, ptx)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	got := make([][]byte, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() {
			e, err := c.get(ctx, k, 1<<20)
			if err == nil {
				got[i] = e.ptx
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || string(got[i]) != ptx {
			t.Fatalf("instance %d: %q %v", i, got[i], errs[i])
		}
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("8 instances read the PTX %d times, want 1", n)
	}

	if err := os.WriteFile(k.PTXFile, []byte(".version 8.0\n.entry evil()\n{ ret; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := c.get(ctx, k, 1<<20)
	if err != nil || string(e.ptx) != ptx {
		t.Fatalf("an instance made after the file changed: %q %v, want the bytes checked first", e.ptx, err)
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("after the file changed: %d reads, want 1", n)
	}

	// A kernel of another sha256 (another manifest's) is another entry.
	k2 := *k
	k2.PTXSHA256 = stages.SHA256([]byte("other"))
	if _, err := c.get(ctx, &k2, 1<<20); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), `kernel "double": "`+k.PTXFile+`" changed since the manifest was read`) {
		t.Fatalf("another sha256: %v", err)
	}

	c.close()
	if _, err := c.get(ctx, k, 1<<20); !errors.Is(err, errdefs.ErrClosed) || !strings.Contains(err.Error(), `kernel "double"`) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := e.program(nil, func() (hw.Program, error) { t.Fatal("loaded after close"); return nil, nil }); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("program after close: %v", err)
	}
}

// TestVendorPTXErrorsAreNotKept: a PTX that does not match its sha256, or
// is missing, is refused naming the kernel and the file; the next
// instance reads it again, and once it matches, it is kept.
func TestVendorPTXErrorsAreNotKept(t *testing.T) {
	const ptx = ".version 8.0\n.entry double()\n{ ret; }\n"
	k, c, reads := ptxKernel(t, ptx)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := os.WriteFile(k.PTXFile, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := c.get(ctx, k, 1<<20)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `kernel "double": "`+k.PTXFile+`" changed since the manifest was read: it hashes to `+stages.SHA256([]byte("changed"))) {
		t.Fatalf("changed: %v", err)
	}
	if err := os.Remove(k.PTXFile); err != nil {
		t.Fatal(err)
	}
	if _, err = c.get(ctx, k, 1<<20); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), `kernel "double"`) || !strings.Contains(err.Error(), k.PTXFile) {
		t.Fatalf("missing: %v", err)
	}
	if err := os.WriteFile(k.PTXFile, []byte(ptx), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if e, err := c.get(ctx, k, 1<<20); err != nil || string(e.ptx) != ptx {
			t.Fatalf("restored: %q %v", e.ptx, err)
		}
	}
	if n := reads.Load(); n != 3 {
		t.Fatalf("%d reads, want 3 (changed, missing, restored once)", n)
	}
}

// TestVendorCubinAndProgramOncePerKey: the cubin is compiled once per
// compute capability and the program loaded once per device, however
// many instances ask at once; a failed compile or load is not kept; a
// caller waiting for the entry gives up when its context ends.
func TestVendorCubinAndProgramOncePerKey(t *testing.T) {
	const ptx = ".version 8.0\n.entry double()\n{ ret; }\n"
	k, c, _ := ptxKernel(t, ptx)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := c.get(ctx, k, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var compiles atomic.Int64
	compile := func(p []byte) ([]byte, error) {
		compiles.Add(1)
		if string(p) != ptx {
			t.Errorf("compile got %q", p)
		}
		return []byte("cubin"), nil
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if b, err := e.cubin(ctx, "9.0", compile); err != nil || string(b) != "cubin" {
				t.Errorf("cubin: %q %v", b, err)
			}
		})
	}
	wg.Wait()
	if n := compiles.Load(); n != 1 {
		t.Fatalf("8 instances compiled %d times, want 1", n)
	}
	if _, err := e.cubin(ctx, "8.0", compile); err != nil || compiles.Load() != 2 {
		t.Fatalf("another compute capability: %v, %d compiles", err, compiles.Load())
	}
	fail := errdefs.Errorf(errdefs.ErrDeadlineExceeded, "jit ran past its timeout")
	if _, err := e.cubin(ctx, "7.0", func([]byte) ([]byte, error) { return nil, fail }); err != fail {
		t.Fatalf("failed compile: %v", err)
	}
	if _, err := e.cubin(ctx, "7.0", compile); err != nil || compiles.Load() != 3 {
		t.Fatalf("after a failed compile: %v, %d compiles", err, compiles.Load())
	}

	p := sim.New()
	defer p.Close()
	dev0, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	dev1, _ := p.AddDevice("gpu1", hw.EngineGPU, sim.NewDeviceConfig())
	var loads atomic.Int64
	load := func(dev hw.Device) func() (hw.Program, error) {
		return func() (hw.Program, error) { loads.Add(1); return dev.Prepare("noop") }
	}
	progs := make([]hw.Program, 8)
	for i := range progs {
		wg.Go(func() {
			var err error
			if progs[i], err = e.program(dev0, load(dev0)); err != nil {
				t.Errorf("program: %v", err)
			}
		})
	}
	wg.Wait()
	for i := range progs {
		if progs[i] != progs[0] {
			t.Fatalf("instance %d got another program", i)
		}
	}
	if _, err := e.program(dev1, load(dev1)); err != nil || loads.Load() != 2 {
		t.Fatalf("8 instances on gpu0 and one on gpu1: %v, %d loads, want 2", err, loads.Load())
	}

	// A caller waits for the entry while another compiles; its context
	// ends first.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.cubin(ctx, "6.0", func([]byte) ([]byte, error) { close(started); <-release; return []byte("c"), nil })
		done <- err
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the compile did not start")
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if _, err := c.get(short, k, 1<<20); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `kernel "double"`) {
		t.Fatalf("waiting with an ended context: %v", err)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the compile did not end")
	}
}

// TestDeploymentClosesItsVendorCache: the cache is the deployment's own,
// and closing the deployment closes it: an instance that would need a
// vendor kernel afterwards is refused, class closed.
func TestDeploymentClosesItsVendorCache(t *testing.T) {
	m, err := manifest.Load("../host.toml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Open(ctx, m, NewConfig().WithOnly("fill"))
	if err != nil {
		t.Fatal(err)
	}
	k, _, _ := ptxKernel(t, ".version 8.0\n")
	if _, err := d.vendor.get(ctx, k, 1<<20); err != nil {
		t.Fatalf("open deployment: %v", err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.vendor.get(ctx, k, 1<<20); !errors.Is(err, errdefs.ErrClosed) {
		t.Fatalf("closed deployment: %v", err)
	}
}
