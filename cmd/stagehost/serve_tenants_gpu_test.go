package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/testutil"
)

// TestServeSuperviseTenantsGPU is TestServeSuperviseTenants on a real
// GPU: session a of tenant acme (bench/cuda/fault_stage.wasm) and b of
// tenant beta (noop) on cuda0, each in its own worker process. A call of
// a that launches the CUDA "fault" kernel (an illegal address, sticky for
// its process) must be answered with an error, acme's worker must restart
// and a serve again, and b must answer every call meanwhile, beta's
// worker never restarting. It logs b's calls during acme's failure
// (count, errors, p50, p99, max: the GPU's recovery as b saw it) and the
// time until a serves again. It skips without a GPU, unless
// STAGEHOST_REQUIRE_GPU=1. (Vendor PTX kernels that fault and hang are
// TestServeSuperviseVendorGPU.)
func TestServeSuperviseTenantsGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	p.Close() // the workers open the GPU, each in its own process
	fault, faultSHA := repoFile(t, "bench/cuda/fault_stage.wasm")
	good, goodSHA := repoFile(t, "stages/testdata/hostile/good_stage.wasm")
	path := filepath.Join(t.TempDir(), "tenants.toml")
	body := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "cuda0"
backend = "cuda"
engine = "gpu"
index = 0
[[module]]
name = "fault_stage"
path = %q
sha256 = %q
[[module]]
name = "good"
path = %q
sha256 = %q
[[tenant]]
name = "acme"
max_failures = 100
[[tenant]]
name = "beta"
[[session]]
name = "a"
stage = "fault_stage"
device = "cuda0"
programs = ["fault", "noop"]
tenant = "acme"
[[session]]
name = "b"
stage = "good"
device = "cuda0"
programs = ["noop"]
tenant = "beta"
`, fault, faultSHA, good, goodSHA)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sv := startSupervised(t, path, 30*time.Second)
	call := func(session string, in byte) (int, string) { return sv.run(session, []byte{in}) }
	workers := func() map[string]workerJSON { ws, _ := sv.workers(); return ws }
	const limit = 60 * time.Second
	for _, s := range []string{"a", "b"} {
		pollFor(t, limit, s+" served", func() (bool, string) {
			code, body := call(s, 0)
			return code == 200, body
		})
	}
	var before map[string]workerJSON
	pollFor(t, limit, "the workers ready", func() (bool, string) {
		before = workers()
		return before["cuda0-acme"].State == "ready" && before["cuda0-beta"].State == "ready", fmt.Sprint(before)
	})

	var mu sync.Mutex
	var lat []time.Duration
	var failN atomic.Int64
	var lastErr atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			t0 := time.Now()
			if code, body := call("b", 0); code == 200 {
				mu.Lock()
				lat = append(lat, time.Since(t0))
				mu.Unlock()
			} else {
				failN.Add(1)
				lastErr.Store(fmt.Sprintf("%d %s", code, body))
			}
		}
	}()
	t0 := time.Now()
	code, body := call("a", 1) // the fault kernel
	answered := time.Since(t0)
	if code == 200 {
		t.Errorf("a's fault call answered 200: %s", body)
	}
	pollFor(t, limit, "a served again", func() (bool, string) {
		code, body := call("a", 0)
		return code == 200, body
	})
	again := time.Since(t0)
	close(done)
	wg.Wait()
	after := workers()
	if after["cuda0-beta"].PID != before["cuda0-beta"].PID || after["cuda0-beta"].Restarts != 0 {
		t.Errorf("beta's worker restarted: %+v, before %+v", after["cuda0-beta"], before["cuda0-beta"])
	}
	if after["cuda0-acme"].Restarts != before["cuda0-acme"].Restarts+1 {
		t.Errorf("acme's worker: %d restarts, before %d", after["cuda0-acme"].Restarts, before["cuda0-acme"].Restarts)
	}
	mu.Lock()
	slices.Sort(lat)
	n := len(lat)
	mu.Unlock()
	if failN.Load() != 0 || n == 0 {
		t.Fatalf("b: %d calls failed (last %v), %d answered", failN.Load(), lastErr.Load(), n)
	}
	t.Logf("a's fault call: %d %s after %v; a served again %v after the fault", code, strings.TrimSpace(body), answered.Round(time.Millisecond), again.Round(time.Millisecond))
	t.Logf("b during acme's failure: %d calls, 0 errors, p50 %v, p99 %v, max %v", n, lat[n/2], lat[n*99/100], lat[n-1])
	sv.stop(t)
}
