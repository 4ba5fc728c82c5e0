package cuda

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// TestMain lets this test binary stand in for the JIT child process
// (STAGEHOST_TEST_JIT=ok|hang|fail), so the child's orchestration is
// tested without a GPU, and for the other process of the hostile-kernel
// tests (STAGEHOST_TEST_ROLE=secret|spin, vendor_hostile_gpu_test.go).
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	switch os.Getenv("STAGEHOST_TEST_JIT") {
	case "":
		os.Exit(m.Run())
	case "ok":
		ptx, _ := io.ReadAll(os.Stdin)
		out := os.Args[len(os.Args)-1]
		_ = os.WriteFile(out, append([]byte("CUBIN:"), ptx...), 0o644)
		os.Exit(0)
	case "real": // the real child, as `stagehost internal-jit -out FILE` runs it
		ptx, _ := io.ReadAll(os.Stdin)
		if err := RunJIT(ptx, os.Args[len(os.Args)-1]); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	case "hang":
		select {} // a JIT that never ends
	case "fail":
		os.Stderr.WriteString("x.ptx:9: error   : Not a name of any known instruction: 'frobnicate'\n")
		os.Exit(1)
	}
}

func jitChild(t *testing.T, mode string) []string {
	t.Setenv("STAGEHOST_TEST_JIT", mode)
	return []string{os.Args[0]}
}

// TestCompilePTX: a compile's cubin is cached by the PTX, the compute
// capability and the driver version; a JIT past its timeout is killed
// and refused; a refused PTX carries the child's log.
func TestCompilePTX(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	cfg := JITConfig{Command: jitChild(t, "ok"), CacheDir: dir, ComputeCapability: "9.0", DriverVersion: 13000, Timeout: 20 * time.Second}
	ptx := []byte(".version 8.0\n.target sm_90\n")
	cubin, cached, err := CompilePTX(ctx, cfg, "k", ptx)
	if err != nil || cached || string(cubin) != "CUBIN:"+string(ptx) {
		t.Fatalf("first compile: %q %v %v", cubin, cached, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cubin", JITCacheKey(ptx, "9.0", 13000)+".cubin")); err != nil {
		t.Fatal(err)
	}
	// A cache hit does not run the child (which now fails).
	cfg.Command = jitChild(t, "fail")
	if cubin, cached, err = CompilePTX(ctx, cfg, "k", ptx); err != nil || !cached || string(cubin) != "CUBIN:"+string(ptx) {
		t.Fatalf("second compile: %q %v %v", cubin, cached, err)
	}
	// Another compute capability or driver is another key.
	if JITCacheKey(ptx, "9.0", 13000) == JITCacheKey(ptx, "8.0", 13000) || JITCacheKey(ptx, "9.0", 13000) == JITCacheKey(ptx, "9.0", 12080) {
		t.Fatal("cache keys do not depend on the compute capability and the driver")
	}
	cfg.ComputeCapability = "8.0"
	_, _, err = CompilePTX(ctx, cfg, "k", ptx)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `kernel "k": the PTX does not compile (exit status 1 after`) ||
		!strings.Contains(err.Error(), "x.ptx:9: error   : Not a name of any known instruction") {
		t.Fatalf("failing child: %v", err)
	}
	// A JIT past its timeout is killed.
	cfg.Command, cfg.Timeout = jitChild(t, "hang"), 300*time.Millisecond
	start := time.Now()
	_, _, err = CompilePTX(ctx, cfg, "k", []byte("other"))
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), `kernel "k": compiling its PTX took longer than its jit_timeout of 300ms: the JIT process was killed and the kernel refused`) {
		t.Fatalf("hanging child: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the hanging child was stopped after %s", d)
	}
}

// TestCompilePTXCubinCap: a cubin over maxCubin is refused from the JIT
// process and not used from the cache (compiled again).
func TestCompilePTXCubinCap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := maxCubin
	t.Cleanup(func() { maxCubin = old })
	dir := t.TempDir()
	cfg := JITConfig{Command: jitChild(t, "ok"), CacheDir: dir, ComputeCapability: "9.0", DriverVersion: 13000, Timeout: 20 * time.Second}
	ptx := []byte("0123456789") // the child writes "CUBIN:" + ptx, 16 bytes
	maxCubin = 15
	if _, _, err := CompilePTX(ctx, cfg, "k", ptx); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "the JIT process wrote a cubin of more than 15 bytes") {
		t.Fatalf("a cubin over the cap: %v", err)
	}
	maxCubin = 16
	if _, cached, err := CompilePTX(ctx, cfg, "k", ptx); err != nil || cached {
		t.Fatalf("a cubin at the cap: cached %v, %v", cached, err)
	}
	if _, cached, err := CompilePTX(ctx, cfg, "k", ptx); err != nil || !cached {
		t.Fatalf("the cached cubin at the cap: cached %v, %v", cached, err)
	}
	maxCubin = 15 // the cached 16 bytes are now over it: compiled again, and refused
	if _, cached, err := CompilePTX(ctx, cfg, "k", ptx); cached || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a cached cubin over the cap: cached %v, %v", cached, err)
	}
}

// TestCompilePTXMakesItsCacheDir: a cache directory that does not exist
// yet is made (stagehost check compiles before anything else made it).
func TestCompilePTXMakesItsCacheDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "not", "yet")
	cfg := JITConfig{Command: jitChild(t, "ok"), CacheDir: dir, ComputeCapability: "9.0", DriverVersion: 13000, Timeout: 20 * time.Second}
	ptx := []byte(".version 8.0\n.target sm_90\n")
	if _, _, err := CompilePTX(ctx, cfg, "k", ptx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cubin", JITCacheKey(ptx, "9.0", 13000)+".cubin")); err != nil {
		t.Fatal(err)
	}
}

// inFreshProcess runs the calling test alone in a new process of this
// test binary and reports whether it did (the caller then returns): a
// device fault poisons every context of its process (docs/gpu.md), so a
// GPU test that must see a healthy device cannot share a process with
// the fault tests.
func inFreshProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv("STAGEHOST_TEST_FRESH") == t.Name() {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count", "1")
	cmd.Env = append(os.Environ(), "STAGEHOST_TEST_FRESH="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("%s in a process of its own:\n%s", t.Name(), out)
	if err != nil {
		t.Fatalf("%s: %v", t.Name(), err)
	}
	if strings.Contains(string(out), "--- SKIP: "+t.Name()) {
		t.Skip("skipped in its own process (above)")
	}
	return true
}
