// Command supervise drives `stagehost serve --supervise` for
// bench/cuda/supervise.sh (issue 11's H200 run): a GPU worker and a host
// worker serve one session each; the GPU worker's device is made to fail
// (-mode kernel: a call launches the CUDA "fault" kernel, a sticky fault
// that loses the GPU for that process; -mode kill: SIGKILL of the worker),
// and the client measures the time from the fault until the GPU session
// serves again, while it keeps calling the host session (none of those
// calls may fail, and /readyz and the host session's /ready must
// answer 200 throughout). It checks that only the GPU worker restarted and
// prints a table. Every request has a timeout, so it never hangs.
//
//	supervise -addr 127.0.0.1:18081 -gpu-session gpu -gpu-worker gpu0 -host-session host -host-worker host0 -mode kernel
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type worker struct {
	Name     string `json:"name"`
	PID      int    `json:"pid"`
	State    string `json:"state"`
	Restarts int    `json:"restarts"`
	LastExit *struct {
		Synthetic  bool   `json:"synthetic"`
		SignalName string `json:"signal_name"`
		Code       int    `json:"code"`
		Reason     string `json:"reason"`
	} `json:"last_exit"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18081", "the supervisor's address")
	gpuSession := flag.String("gpu-session", "gpu", "the session on the GPU worker's device (its stage is fault_stage)")
	gpuWorker := flag.String("gpu-worker", "gpu0", "the GPU worker (its device's name)")
	hostSession := flag.String("host-session", "host", "the session on the host worker's device")
	hostWorker := flag.String("host-worker", "host0", "the host worker")
	mode := flag.String("mode", "kernel", "kernel: launch the fault kernel; kill: SIGKILL the GPU worker; resident: start the resident through the supervisor")
	resident := flag.String("resident", "pp", "with -mode resident: the resident session on the GPU worker's device")
	starts := flag.Int("starts", 5, "with -mode resident: runs started one after another")
	wait := flag.Duration("wait", 60*time.Second, "how long each step may take")
	flag.Parse()
	c := &http.Client{Timeout: 20 * time.Second}
	base := "http://" + *addr
	fail := func(format string, args ...any) {
		fmt.Printf("FAIL: "+format+"\n", args...)
		os.Exit(1)
	}
	get := func(path string) (int, []byte) {
		resp, err := c.Get(base + path)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	call := func(session string, in byte) (int, []byte) {
		resp, err := c.Post(base+"/v1/sessions/"+session+"/run", "application/octet-stream", bytes.NewReader([]byte{in}))
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	workers := func() map[string]worker {
		code, b := get("/v1/workers")
		var ws struct{ Workers []worker }
		if code != 200 || json.Unmarshal(b, &ws) != nil {
			return nil
		}
		out := map[string]worker{}
		for _, w := range ws.Workers {
			out[w.Name] = w
		}
		return out
	}
	until := func(what string, cond func() bool) time.Duration {
		start := time.Now()
		for deadline := start.Add(*wait); ; time.Sleep(2 * time.Millisecond) {
			if cond() {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				fail("%s: not within %v", what, *wait)
			}
		}
	}

	// 1. Both workers reported ready, both sessions served. A worker can
	// serve a call a moment before the supervisor reads its ready report,
	// so both conditions are waited for.
	var before map[string]worker
	until("both sessions served and both workers ready", func() bool {
		a, _ := call(*gpuSession, 0)
		b, _ := call(*hostSession, 0)
		before = workers()
		return a == 200 && b == 200 && before != nil &&
			before[*gpuWorker].State == "ready" && before[*hostWorker].State == "ready"
	})

	if *mode == "resident" {
		residentRuns(c, base, *resident, *starts, *wait, until, fail)
		return
	}

	// 2. The host session is called all along.
	var hostOK, hostFailed atomic.Int64
	var lastHostErr atomic.Value
	var latMu sync.Mutex
	var hostLat []time.Duration // the host session's calls that answered 200
	var readyOK, readyFailed atomic.Int64
	var lastReadyErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			tc := time.Now()
			if code, b := call(*hostSession, 0); code == 200 {
				hostOK.Add(1)
				latMu.Lock()
				hostLat = append(hostLat, time.Since(tc))
				latMu.Unlock()
			} else {
				hostFailed.Add(1)
				lastHostErr.Store(fmt.Sprintf("%d %s", code, b))
			}
			// The front stays ready, and so does the host session.
			for _, p := range []string{"/readyz", "/v1/sessions/" + *hostSession + "/ready"} {
				if code, b := get(p); code == 200 {
					readyOK.Add(1)
				} else {
					readyFailed.Add(1)
					lastReadyErr.Store(fmt.Sprintf("%s: %d %s", p, code, b))
				}
			}
		}
	}()

	// 3. The fault.
	t0 := time.Now()
	var faultAnswer string
	switch *mode {
	case "kernel":
		code, b := call(*gpuSession, 1)
		faultAnswer = fmt.Sprintf("%d %s", code, bytes.TrimSpace(b))
	case "kill":
		if err := syscall.Kill(before[*gpuWorker].PID, syscall.SIGKILL); err != nil {
			fail("kill %d: %v", before[*gpuWorker].PID, err)
		}
		faultAnswer = "SIGKILL"
	default:
		fail("unknown -mode %q", *mode)
	}
	answered := time.Since(t0)
	hostAtFault := hostOK.Load()
	restarted := until("the GPU worker restarted and ready", func() bool {
		w := workers()[*gpuWorker]
		return w.State == "ready" && w.PID != before[*gpuWorker].PID
	})
	serving := until("the GPU session served again", func() bool {
		code, _ := call(*gpuSession, 0)
		return code == 200
	})
	total := time.Since(t0)
	close(stop)
	wg.Wait()
	after := workers()
	g, h := after[*gpuWorker], after[*hostWorker]

	fmt.Printf("\n%-28s %s\n", "mode", *mode)
	fmt.Printf("%-28s %s\n", "fault call answered", faultAnswer)
	fmt.Printf("%-28s %v\n", "fault call took", answered.Round(time.Millisecond))
	fmt.Printf("%-28s %v\n", "answer → GPU worker ready", restarted.Round(time.Millisecond))
	fmt.Printf("%-28s %v\n", "fault → GPU session serves", total.Round(time.Millisecond))
	fmt.Printf("%-28s %v\n", "  (then polling)", serving.Round(time.Millisecond))
	fmt.Printf("%-28s %d ok, %d failed (%d ok after the fault)\n", "host session calls", hostOK.Load(), hostFailed.Load(), hostOK.Load()-hostAtFault)
	latMu.Lock()
	slices.Sort(hostLat)
	if n := len(hostLat); n > 0 {
		fmt.Printf("%-28s p50 %v, p99 %v, max %v (%d calls)\n", "host session latency", hostLat[n/2].Round(time.Microsecond), hostLat[n*99/100].Round(time.Microsecond), hostLat[n-1].Round(time.Microsecond), n)
	}
	latMu.Unlock()
	fmt.Printf("%-28s %d ok, %d not ready\n", "/readyz, host's /ready", readyOK.Load(), readyFailed.Load())
	fmt.Printf("%-28s pid %d → %d, restarts %d → %d\n", "GPU worker", before[*gpuWorker].PID, g.PID, before[*gpuWorker].Restarts, g.Restarts)
	if g.LastExit != nil {
		fmt.Printf("%-28s synthetic %v, signal %q, code %d, %s\n", "GPU worker's last exit", g.LastExit.Synthetic, g.LastExit.SignalName, g.LastExit.Code, g.LastExit.Reason)
	}
	fmt.Printf("%-28s pid %d → %d, restarts %d → %d\n", "host worker", before[*hostWorker].PID, h.PID, before[*hostWorker].Restarts, h.Restarts)
	switch {
	case hostFailed.Load() != 0:
		fail("%d host session calls failed (last: %v)", hostFailed.Load(), lastHostErr.Load())
	case readyFailed.Load() != 0:
		fail("%d readiness probes said not ready (last: %v)", readyFailed.Load(), lastReadyErr.Load())
	case h.PID != before[*hostWorker].PID || h.Restarts != before[*hostWorker].Restarts:
		fail("the host worker restarted too")
	case g.Restarts != before[*gpuWorker].Restarts+1:
		fail("the GPU worker restarted %d times, want 1", g.Restarts-before[*gpuWorker].Restarts)
	}
	fmt.Println("PASS")
}

// residentRuns starts runs of a resident session through the supervisor
// (which has no resident: the lattice takes each start to the worker of
// the resident's gpu), one after another, each polled until it ends, and
// prints a line a run: the start's answer time and the run's end. Every
// run must end verified.
func residentRuns(c *http.Client, base, name string, starts int, wait time.Duration,
	until func(string, func() bool) time.Duration, fail func(string, ...any)) {
	type run struct {
		ID       int    `json:"id"`
		State    string `json:"state"`
		Error    string `json:"error"`
		Rounds   int    `json:"rounds"`
		Duration int64  `json:"duration_ns"`
		Verified bool   `json:"verified"`
	}
	fmt.Printf("\n%-6s %-10s %-14s %-10s %-8s %s\n", "start", "answer", "start→ended", "run", "rounds", "state")
	for i := 1; i <= starts; i++ {
		t0 := time.Now()
		resp, err := c.Post(base+"/v1/residents/"+name+"/start", "application/json", nil)
		if err != nil {
			fail("start %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered := time.Since(t0)
		var st struct {
			ID int `json:"id"`
		}
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &st) != nil {
			fail("start %d: %d %s", i, resp.StatusCode, bytes.TrimSpace(b))
		}
		var last run
		until(fmt.Sprintf("run %d ended", st.ID), func() bool {
			resp, err := c.Get(base + "/v1/residents/" + name)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var rs struct {
				Runs []run `json:"runs"`
			}
			if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&rs) != nil {
				return false
			}
			for _, r := range rs.Runs {
				if r.ID == st.ID && r.State != "starting" && r.State != "running" {
					last = r
					return true
				}
			}
			return false
		})
		ended := time.Since(t0)
		fmt.Printf("%-6d %-10v %-14v %-10v %-8d %s %s\n", i, answered.Round(time.Microsecond), ended.Round(time.Millisecond),
			time.Duration(last.Duration).Round(time.Microsecond), last.Rounds, last.State, last.Error)
		if last.State != "verified" || !last.Verified {
			fail("run %d of %s ended %s: %s", last.ID, name, last.State, last.Error)
		}
	}
	fmt.Println("PASS")
}
