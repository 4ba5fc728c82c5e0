// Command residents drives `stagehost serve` for bench/cuda/residents.sh:
// it POSTs N resident starts in a row, sampling the parked resident GPU
// participants (stagehost_resident_parked) after each, then polls the
// resident's runs until none is running or a bound passes, and prints a
// table. Every request has a timeout, so the client itself never hangs.
//
//	residents -addr 127.0.0.1:18080 -resident pp -device gpu0 -n 100 -bound 32
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "serve's address")
	resident := flag.String("resident", "pp", "the resident to start")
	device := flag.String("device", "gpu0", "its GPU device (for the parked metric)")
	n := flag.Int("n", 100, "starts in a row")
	bound := flag.Int("bound", 32, "the device's max_parked")
	wait := flag.Duration("wait", 60*time.Second, "how long to wait for the runs to finish")
	flag.Parse()
	c := &http.Client{Timeout: 20 * time.Second}
	base := "http://" + *addr

	// Ready?
	ready := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if resp, err := c.Get(base + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ready = true
				break
			}
		}
	}
	if !ready {
		fmt.Println("serve never became ready")
		os.Exit(2)
	}

	codes := map[string]int{}
	reasons := map[string]int{}
	maxParked, maxStart := 0.0, time.Duration(0)
	var total time.Duration
	for i := 0; i < *n; i++ {
		t0 := time.Now()
		resp, err := c.Post(base+"/v1/residents/"+*resident+"/start", "application/json", nil)
		d := time.Since(t0)
		total += d
		maxStart = max(maxStart, d)
		if err != nil {
			codes["error"]++
			reasons[err.Error()]++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes[strconv.Itoa(resp.StatusCode)]++
		if resp.StatusCode != 202 {
			var e struct {
				Class string `json:"class"`
				Error string `json:"error"`
			}
			_ = json.Unmarshal(body, &e)
			msg := e.Error
			if i := strings.Index(msg, ": "); i > 0 && strings.Contains(msg, "parked on") {
				msg = msg[i+2:]
			}
			if len(msg) > 120 {
				msg = msg[:120]
			}
			reasons[e.Class+": "+msg]++
		}
		if p, ok := parked(c, base, *device); ok {
			maxParked = max(maxParked, p)
		}
	}

	// Wait for every run to finish.
	var st struct {
		Running     int   `json:"running"`
		Quarantined []int `json:"quarantined"`
		Runs        []struct {
			ID       int    `json:"id"`
			State    string `json:"state"`
			Error    string `json:"error"`
			Duration int64  `json:"duration_ns"`
		} `json:"runs"`
	}
	finished := false
	t0 := time.Now()
	for time.Since(t0) < *wait {
		resp, err := c.Get(base + "/v1/residents/" + *resident)
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if st.Running == 0 {
				finished = true
				break
			}
		}
		if p, ok := parked(c, base, *device); ok {
			maxParked = max(maxParked, p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	states := map[string]int{}
	var durs []time.Duration
	for _, r := range st.Runs {
		states[r.State]++
		durs = append(durs, time.Duration(r.Duration))
		if r.State != "verified" && r.Error != "" {
			reasons["run "+r.State+": "+trim(r.Error)]++
		}
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	fmt.Println("reasons:")
	for k, v := range reasons {
		fmt.Printf("  %4d  %s\n", v, k)
	}
	fmt.Println()
	fmt.Printf("| starts | 202 | 429 | 503 | other | max start | mean start | max parked (bound %d) | all finished | verified | failed | quarantined | run p50 | run max |\n", *bound)
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	other := *n - codes["202"] - codes["429"] - codes["503"]
	p50, pmax := time.Duration(0), time.Duration(0)
	if len(durs) > 0 {
		p50, pmax = durs[len(durs)/2], durs[len(durs)-1]
	}
	fmt.Printf("| %d | %d | %d | %d | %d | %v | %v | %.0f | %v (%v) | %d | %d | %d | %v | %v |\n",
		*n, codes["202"], codes["429"], codes["503"], other, maxStart.Round(time.Microsecond), (total / time.Duration(max(*n, 1))).Round(time.Microsecond),
		maxParked, finished, time.Since(t0).Round(time.Millisecond), states["verified"], states["failed"], states["quarantined"], p50.Round(time.Microsecond), pmax.Round(time.Microsecond))
	if !finished || maxParked > float64(*bound) {
		os.Exit(1)
	}
}

func trim(s string) string {
	if len(s) > 160 {
		return s[:160]
	}
	return s
}

// parked reads stagehost_resident_parked{device=...} from /metrics.
func parked(c *http.Client, base, device string) (float64, bool) {
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	want := `stagehost_resident_parked{device="` + device + `"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
