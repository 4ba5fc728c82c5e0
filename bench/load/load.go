// Command load is the service's load test: it starts the real
// `stagehost serve` binary on loopback with a manifest of healthy pooled
// sessions and sessions with injected faults, runs a number of clients
// against it for a bounded time and number of requests, and checks that
// every request got an answer (lost = sent − answered = 0) and that the
// server's own counts (/v1/sessions and stagehost_session_runs_total)
// agree with the clients'.
//
//	go run ./bench/load -clients 64 -duration 60s
//
// BENCHMARKS.md records its results; the test in this directory runs a
// short version (2 s, 8 clients) in the normal suite, and the full one
// with STAGEHOST_LOAD=1.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stagehost/stagehost/stages"
)

// Config is one load run.
type Config struct {
	Clients     int           // concurrent clients, each one request at a time
	Duration    time.Duration // how long clients keep sending
	MaxRequests int           // stop sending after this many requests in all
	Timeout     time.Duration // per request (a request past it is a transport error)
	Repo        string        // the repository root (finds the stages and the command)
	Bin         string        // the stagehost binary; "" builds it into a temp dir
	Log         io.Writer     // progress lines; nil: none
}

// Mix is the sessions each client cycles through, in order: mostly the
// healthy pool, and one of each faulty session.
var Mix = []string{"pool", "pool", "pool", "pool", "pool", "tight", "flaky", "pool", "trap", "liar"}

// manifest is the load test's manifest. pool is four instances of the
// good stage over gpu0 and gpu1; tight is one instance whose queue holds
// one call for at most 20ms (busy under load); flaky's device rejects
// its first 40 submissions and fails the next 40 commands; trap's stage
// traps on every call; liar's fence lies (its device hangs its streams),
// so its first call quarantines it and every later call is refused.
const manifest = `version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu1"
backend = "sim"
engine = "gpu"
[[device]]
name = "gpu2"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "reject"
count = 40
session = "flaky"
[[device.sim.fault]]
kind = "fail_completion"
count = 40
session = "flaky"
[[device]]
name = "gpu3"
backend = "sim"
engine = "gpu"
[[device.sim.fault]]
kind = "hang"
session = "liar"
[[module]]
name = "good"
path = %q
sha256 = %q
[[module]]
name = "trap"
path = %q
sha256 = %q
[[module]]
name = "lying_fence"
path = %q
sha256 = %q
[[session]]
name = "pool"
stage = "good"
devices = ["gpu0", "gpu1"]
instances = 4
programs = ["noop"]
[[session]]
name = "tight"
stage = "good"
device = "gpu1"
programs = ["noop"]
queue_limit = 1
queue_timeout = "20ms"
[[session]]
name = "flaky"
stage = "good"
device = "gpu2"
programs = ["noop"]
[[session]]
name = "trap"
stage = "trap"
device = "gpu0"
[[session]]
name = "liar"
stage = "lying_fence"
device = "gpu3"
programs = ["noop"]
`

// Report is what a run measured.
type Report struct {
	Clients         int                          `json:"clients"`
	Duration        time.Duration                `json:"duration_ns"` // from the first request to the last answer
	Sent            int                          `json:"sent"`
	Answered        int                          `json:"answered"`
	TransportErrors int                          `json:"transport_errors"`
	Lost            int                          `json:"lost"` // Sent − Answered
	ByClass         map[string]int               `json:"by_class"`
	BySession       map[string]map[string]int    `json:"by_session"` // session → class → answers
	SentBySession   map[string]int               `json:"sent_by_session"`
	Server          map[string]map[string]uint64 `json:"server"`      // /v1/sessions outcomes
	Metrics         map[string]map[string]uint64 `json:"metrics"`     // stagehost_session_runs_total
	RetryAfter      int                          `json:"retry_after"` // 429 and 503 answers that had Retry-After
	ReqPerSec       float64                      `json:"req_per_sec"`
	P50, P99, Max   time.Duration                `json:"-"`
	Mismatches      []string                     `json:"mismatches"` // where the server's counts differ from the clients'
	ServerExit      string                       `json:"server_exit"`
}

// Check returns an error unless every request was answered and the
// server's counts agree with the clients'.
func (r *Report) Check() error {
	var errs []error
	if r.Lost != 0 || r.Sent != r.Answered {
		errs = append(errs, fmt.Errorf("lost %d of %d requests (%d transport errors)", r.Lost, r.Sent, r.TransportErrors))
	}
	for _, m := range r.Mismatches {
		errs = append(errs, errors.New(m))
	}
	if r.ServerExit != "ok" {
		errs = append(errs, fmt.Errorf("server exit: %s", r.ServerExit))
	}
	return errors.Join(errs...)
}

// String is the report as a few lines of text.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "clients %d, %v: sent %d, answered %d, lost %d, transport errors %d\n",
		r.Clients, r.Duration.Round(time.Millisecond), r.Sent, r.Answered, r.Lost, r.TransportErrors)
	fmt.Fprintf(&b, "throughput %.0f req/s; latency p50 %v, p99 %v, max %v\n", r.ReqPerSec,
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond))
	fmt.Fprintf(&b, "by class: %s\n", counts(r.ByClass))
	for _, s := range sortedKeys(r.BySession) {
		fmt.Fprintf(&b, "  %-6s sent %d: %s\n", s, r.SentBySession[s], counts(r.BySession[s]))
	}
	fmt.Fprintf(&b, "answers with Retry-After (429/503): %d\n", r.RetryAfter)
	if len(r.Mismatches) == 0 {
		b.WriteString("server counts (/v1/sessions, /metrics) agree with the clients'\n")
	}
	for _, m := range r.Mismatches {
		fmt.Fprintf(&b, "MISMATCH: %s\n", m)
	}
	fmt.Fprintf(&b, "server exit: %s\n", r.ServerExit)
	return b.String()
}

func counts[V int | uint64](m map[string]V) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// FindRepo returns the repository root: the nearest directory from dir
// up that holds go.mod and cmd/stagehost.
func FindRepo(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "stagehost", "main.go")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("not inside the stagehost repository")
		}
		dir = up
	}
}

// writeManifest writes the manifest into dir with the repository's stages.
func writeManifest(repo, dir string) (string, error) {
	var args []any
	for _, p := range []string{"good_stage", "trap_stage", "lying_fence"} {
		path := filepath.Join(repo, "stages", "testdata", "hostile", p+".wasm")
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		args = append(args, path, stages.SHA256(b))
	}
	path := filepath.Join(dir, "load.toml")
	return path, os.WriteFile(path, fmt.Appendf(nil, manifest, args...), 0o644)
}

var servingLine = regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)`)

// Run builds (unless cfg.Bin is set) and starts the binary, runs the
// load, reads the server's counts, stops the server with SIGTERM and
// returns the report. The run is bounded by cfg.Duration, cfg.MaxRequests
// and the per-request timeout; ctx ends it early.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Clients < 1 || cfg.Duration <= 0 || cfg.MaxRequests < 1 {
		return nil, errors.New("clients, duration and max requests must be positive")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	logf := func(format string, a ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", a...)
		}
	}
	dir, err := os.MkdirTemp("", "stagehost-load-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := cfg.Bin
	if bin == "" {
		bin = filepath.Join(dir, "stagehost")
		logf("building %s", bin)
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/stagehost")
		build.Dir = cfg.Repo
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	mpath, err := writeManifest(cfg.Repo, dir)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--log-level", "error", mpath)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
		}
	}()
	lines := bufio.NewScanner(stdout)
	base := ""
	for base == "" && lines.Scan() {
		if m := servingLine.FindStringSubmatch(lines.Text()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		_ = cmd.Wait()
		return nil, fmt.Errorf("stagehost serve printed no serving line; stderr:\n%s", stderr.String())
	}
	go func() {
		for lines.Scan() {
		}
		exited <- cmd.Wait()
	}()
	logf("serving on %s; %d clients for %v", base, cfg.Clients, cfg.Duration)

	rep := load(ctx, cfg, base)
	readServer(ctx, base, rep)
	compare(rep)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return rep, err
	}
	select {
	case err := <-exited:
		rep.ServerExit = "ok"
		if err != nil {
			rep.ServerExit = fmt.Sprintf("%v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		rep.ServerExit = "did not exit within 30s of SIGTERM"
	}
	return rep, nil
}

// load runs the clients and counts their answers.
func load(ctx context.Context, cfg Config, base string) *Report {
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Clients, MaxConnsPerHost: cfg.Clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cfg.Timeout}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	rep := &Report{Clients: cfg.Clients, ByClass: map[string]int{}, BySession: map[string]map[string]int{}, SentBySession: map[string]int{}}
	var mu sync.Mutex
	var lat []time.Duration
	budget := make(chan struct{}, cfg.MaxRequests) // one token per request that may be sent
	for range cfg.MaxRequests {
		budget <- struct{}{}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			sent, answered, transport := map[string]int{}, map[string]map[string]int{}, 0
			retry := 0
			for i := c; ; i++ { // clients start at different points of the mix
				select {
				case <-ctx.Done():
				case <-budget:
				}
				if ctx.Err() != nil {
					break
				}
				sess := Mix[i%len(Mix)]
				sent[sess]++
				t0 := time.Now()
				class, hasRetry, err := call(client, base, sess)
				if err != nil {
					transport++
					continue
				}
				mine = append(mine, time.Since(t0))
				if answered[sess] == nil {
					answered[sess] = map[string]int{}
				}
				answered[sess][class]++
				if hasRetry {
					retry++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, mine...)
			rep.TransportErrors += transport
			rep.RetryAfter += retry
			for s, n := range sent {
				rep.Sent += n
				rep.SentBySession[s] += n
			}
			for s, m := range answered {
				if rep.BySession[s] == nil {
					rep.BySession[s] = map[string]int{}
				}
				for class, n := range m {
					rep.Answered += n
					rep.ByClass[class] += n
					rep.BySession[s][class] += n
				}
			}
		}()
	}
	wg.Wait()
	rep.Duration = time.Since(start)
	rep.Lost = rep.Sent - rep.Answered
	rep.ReqPerSec = float64(rep.Answered) / rep.Duration.Seconds()
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		rep.P50 = lat[(50*n+99)/100-1]
		rep.P99 = lat[(99*n+99)/100-1]
		rep.Max = lat[n-1]
	}
	return rep
}

// call sends one run request and returns its class: ok for 200, else the
// JSON error body's class (or "status_N" for a body that is not one).
func call(client *http.Client, base, sess string) (class string, retryAfter bool, err error) {
	resp, err := client.Post(base+"/v1/sessions/"+sess+"/run", "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", false, err
	}
	if resp.StatusCode == http.StatusOK {
		return "ok", false, nil
	}
	retryAfter = resp.Header.Get("Retry-After") != "" && (resp.StatusCode == 429 || resp.StatusCode == 503)
	var e struct{ Class string }
	if json.Unmarshal(body, &e) != nil || e.Class == "" {
		return "status_" + strconv.Itoa(resp.StatusCode), retryAfter, nil
	}
	return e.Class, retryAfter, nil
}

// readServer reads /v1/sessions' outcomes and stagehost_session_runs_total.
func readServer(ctx context.Context, base string, rep *Report) {
	get := func(path string) []byte {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("GET %s: %v", path, err))
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	var list struct {
		Sessions []struct {
			Name     string
			Outcomes map[string]uint64
		}
	}
	if err := json.Unmarshal(get("/v1/sessions"), &list); err != nil {
		rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("/v1/sessions: %v", err))
	}
	rep.Server = map[string]map[string]uint64{}
	for _, s := range list.Sessions {
		rep.Server[s.Name] = s.Outcomes
	}
	rep.Metrics = map[string]map[string]uint64{}
	line := regexp.MustCompile(`^stagehost_session_runs_total\{(.*)\} (\S+)$`)
	label := regexp.MustCompile(`(\w+)="([^"]*)"`)
	for _, l := range strings.Split(string(get("/metrics")), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range label.FindAllStringSubmatch(m[1], -1) {
			labels[kv[1]] = kv[2]
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		if rep.Metrics[labels["session"]] == nil {
			rep.Metrics[labels["session"]] = map[string]uint64{}
		}
		rep.Metrics[labels["session"]][labels["outcome"]] = uint64(v)
	}
}

// compare records every difference between the clients' answers by
// session and class and the server's counts. A request the clients gave
// up on (a transport error) is on the server's side only, as
// client_closed, so with transport errors only the totals are compared.
func compare(rep *Report) {
	for _, sess := range sortedKeys(rep.SentBySession) {
		for _, src := range []struct {
			name string
			m    map[string]uint64
		}{{"/v1/sessions", rep.Server[sess]}, {"stagehost_session_runs_total", rep.Metrics[sess]}} {
			var total uint64
			for _, n := range src.m {
				total += n
			}
			if total != uint64(rep.SentBySession[sess]) {
				rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("session %s: %s counts %d calls, the clients sent %d", sess, src.name, total, rep.SentBySession[sess]))
				continue
			}
			if rep.TransportErrors > 0 {
				continue
			}
			for _, class := range sortedKeys(rep.BySession[sess]) {
				if got, want := src.m[class], uint64(rep.BySession[sess][class]); got != want {
					rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("session %s class %s: %s counts %d, the clients got %d", sess, class, src.name, got, want))
				}
			}
		}
	}
}
