package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/localcall"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
)

// vendorHostileDeadline is session a's deadline in vendorHostileManifest.
const vendorHostileDeadline = 500 * time.Millisecond

// vendorHostileManifest writes the manifest of TestServeSuperviseVendorGPU
// and returns its path: on cuda0, session a of tenant acme runs
// testdata/vhostile/hostile.wasm with the vendor PTX kernels "vstore" (an
// illegal store) and "vspin" (never returns) of hw/cuda/testdata/vendor;
// session b of tenant beta runs the good stage (noop). fence_timeout is
// 30 s, so that only hang_grace (100 ms) can end a hung call's worker in
// time.
func vendorHostileManifest(t *testing.T) string {
	t.Helper()
	hostile, hostileSHA := repoFile(t, "cmd/stagehost/testdata/vhostile/hostile.wasm")
	good, goodSHA := repoFile(t, "stages/testdata/hostile/good_stage.wasm")
	store, storeSHA := repoFile(t, "hw/cuda/testdata/vendor/store_0x10.ptx")
	spin, spinSHA := repoFile(t, "hw/cuda/testdata/vendor/spin.ptx")
	body := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "cuda0"
backend = "cuda"
engine = "gpu"
index = 0
[[module]]
name = "hostile"
path = %q
sha256 = %q
[[module]]
name = "good"
path = %q
sha256 = %q
[[kernel]]
name = "vstore"
tenant = "acme"
ptx = %q
ptx_sha256 = %q
entry = "store_0x10"
args = []
[[kernel]]
name = "vspin"
tenant = "acme"
ptx = %q
ptx_sha256 = %q
entry = "spin"
args = [ { name = "flag", kind = "buffer", dtype = "i32", dir = "in" } ]
[[tenant]]
name = "acme"
max_failures = 100
[[tenant]]
name = "beta"
[[session]]
name = "a"
stage = "hostile"
device = "cuda0"
programs = ["vstore", "vspin"]
streams = ["s0"]
buffer = [ { name = "flag", size = 4 } ]
deadline = %q
fence_timeout = "30s"
[[session]]
name = "b"
stage = "good"
device = "cuda0"
programs = ["noop"]
tenant = "beta"
`, hostile, hostileSHA, good, goodSHA, store, storeSHA, spin, spinSHA, vendorHostileDeadline.String())
	path := filepath.Join(t.TempDir(), "vhostile.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVendorHostileManifest: the GPU test's manifest is valid (checked
// without a GPU), session a belongs to tenant acme through its kernels,
// and plain serve refuses it.
func TestVendorHostileManifest(t *testing.T) {
	m, err := manifest.Load(vendorHostileManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("a").TenantName(); got != "acme" {
		t.Fatalf("a's tenant = %q", got)
	}
	if got := needsWorker(m); len(got) != 1 || !strings.Contains(got[0], `session "a" runs vendor PTX kernel "vstore"`) {
		t.Fatalf("needsWorker = %q", got)
	}
}

// bCall is one of tenant beta's calls during TestServeSuperviseVendorGPU.
type bCall struct {
	start, end time.Time
	ok         bool
	answer     string
}

// TestServeSuperviseVendorGPU: two tenants on the GPU under `serve
// --supervise`. Tenant acme's vendor PTX kernels fault (an illegal
// store) three times and hang (a kernel that never returns) three times;
// tenant beta's session b is called all along. For each round it logs
// b's calls (count, errors, p50, p99, max) and the time until a serves
// again; for a hang also when the worker got SIGKILL, how long it took to
// be reaped, and the device's recovery: from the SIGKILL to the end of
// the first of 20 consecutive calls of b each under 3× b's p50 before
// the round. Every call of b must answer 200, beta's worker must never
// restart; a's faulting call is refused, and its hung call answered
// deadline_exceeded within its deadline plus 250 ms (and 250 ms of
// slack). It skips without a GPU, unless STAGEHOST_REQUIRE_GPU=1.
func TestServeSuperviseVendorGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	p.Close() // the workers open the GPU, each in its own process
	sv := startSupervised(t, vendorHostileManifest(t), 60*time.Second)
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

	// b is called all along.
	var mu sync.Mutex
	var bs []bCall
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
			c := bCall{start: time.Now()}
			code, body := call("b", 0)
			c.end, c.ok = time.Now(), code == 200
			if !c.ok {
				c.answer = fmt.Sprintf("%d %s", code, body)
			}
			mu.Lock()
			bs = append(bs, c)
			mu.Unlock()
		}
	}()
	since := func(t0 time.Time) []bCall {
		mu.Lock()
		defer mu.Unlock()
		i := slices.IndexFunc(bs, func(c bCall) bool { return !c.start.Before(t0) })
		if i < 0 {
			return nil
		}
		return slices.Clone(bs[i:])
	}
	stats := func(cs []bCall) (n, failed int, p50, p99, maxL time.Duration, last string) {
		var lat []time.Duration
		for _, c := range cs {
			if !c.ok {
				failed++
				last = c.answer
				continue
			}
			lat = append(lat, c.end.Sub(c.start))
		}
		slices.Sort(lat)
		if len(lat) == 0 {
			return len(cs), failed, 0, 0, 0, last
		}
		return len(cs), failed, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], last
	}
	// Wait for b's first calls: the baseline.
	pollFor(t, limit, "b's first calls", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(bs) >= 200, fmt.Sprint(len(bs))
	})

	type round struct {
		kind                        string
		answered                    time.Duration
		code                        int
		again                       time.Duration
		n, failed                   int
		p50, p99, maxL              time.Duration
		killedAfter, reap, recovery time.Duration
		baseline                    time.Duration
	}
	var rounds []round
	for _, kind := range []string{"fault", "fault", "fault", "hang", "hang", "hang"} {
		_, _, base50, _, _, _ := stats(since(time.Now().Add(-2 * time.Second)))
		w0 := workers()["cuda0-acme"]
		in := byte(1)
		if kind == "hang" {
			in = 2
		}
		t0 := time.Now()
		code, body := call("a", in)
		r := round{kind: kind, answered: time.Since(t0), code: code, baseline: base50}
		switch kind {
		case "fault":
			if code == 200 {
				t.Errorf("a's faulting call answered 200: %s", body)
			}
		case "hang":
			if code != 504 || !strings.Contains(body, `"class": "deadline_exceeded"`) || r.answered > vendorHostileDeadline+localcall.Grace+250*time.Millisecond {
				t.Errorf("a's hung call: %d %s after %v; want deadline_exceeded within %v + 250ms (+250ms of slack)", code, body, r.answered, vendorHostileDeadline)
			}
		}
		var w workerJSON
		pollFor(t, limit, "acme's worker restarted and a served again", func() (bool, string) {
			w = workers()["cuda0-acme"]
			if w.State != "ready" || w.PID == w0.PID {
				return false, fmt.Sprint(w)
			}
			code, body := call("a", 0)
			return code == 200, body
		})
		r.again = time.Since(t0)
		if kind == "hang" {
			if w.Hangs != w0.Hangs+1 || w.LastExit == nil || !w.LastExit.Killed || w.LastExit.KilledAt.IsZero() {
				t.Errorf("acme's worker after a hang: hangs %d (before %d), last exit %+v; want one more hang, killed", w.Hangs, w0.Hangs, w.LastExit)
			} else {
				e := w.LastExit
				r.killedAfter, r.reap = e.KilledAt.Sub(t0), e.Time.Sub(e.KilledAt)
				// Recovery: from the SIGKILL to the end of the first of 20
				// consecutive calls of b under 3× the baseline p50.
				cs := since(e.KilledAt)
				run := 0
				for i, c := range cs {
					if c.ok && c.end.Sub(c.start) < 3*base50 {
						run++
					} else {
						run = 0
					}
					if run == 20 {
						r.recovery = cs[i-19].end.Sub(e.KilledAt)
						break
					}
				}
			}
		} else if w.DeviceLosses != w0.DeviceLosses+1 {
			t.Errorf("acme's worker after a fault: %d device losses, before %d", w.DeviceLosses, w0.DeviceLosses)
		}
		var last string
		r.n, r.failed, r.p50, r.p99, r.maxL, last = stats(since(t0))
		if r.failed != 0 {
			t.Errorf("%s: %d of b's %d calls failed (last: %s)", kind, r.failed, r.n, last)
		}
		rounds = append(rounds, r)
	}
	close(done)
	wg.Wait()
	after := workers()
	if after["cuda0-beta"].PID != before["cuda0-beta"].PID || after["cuda0-beta"].Restarts != 0 {
		t.Errorf("beta's worker restarted: %+v, before %+v", after["cuda0-beta"], before["cuda0-beta"])
	}
	var tb strings.Builder
	fmt.Fprintf(&tb, "round  | a answered      | a serves again | b calls | b failed | b p50    | b p99    | b max    | SIGKILL after | reaped   | device recovery\n")
	for _, r := range rounds {
		fmt.Fprintf(&tb, "%-6s | %3d after %-5v | %-14v | %7d | %8d | %-8v | %-8v | %-8v | %-13v | %-8v | %v (b's baseline p50 %v)\n",
			r.kind, r.code, r.answered.Round(time.Millisecond), r.again.Round(time.Millisecond), r.n, r.failed,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.maxL.Round(time.Microsecond),
			r.killedAfter.Round(time.Millisecond), r.reap.Round(100*time.Microsecond), r.recovery.Round(time.Millisecond), r.baseline.Round(time.Microsecond))
	}
	t.Logf("tenant acme's faults and hangs, tenant beta's calls:\n%s", tb.String())
	for _, r := range rounds {
		if r.kind == "hang" && r.recovery == 0 {
			t.Errorf("after a hang, b's calls never ran 20 in a row under 3x its baseline p50")
		}
	}
	sv.stop(t)
}
