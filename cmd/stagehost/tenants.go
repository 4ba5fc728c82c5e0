package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/localcall"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
)

// tenantGuard counts the failures of each tenant's workers under `serve
// --supervise` and quarantines a tenant lattice-wide once it failed
// max_failures times within failure_window ([[tenant]]). A failure is a
// device_lost report of one of its workers (a fault, or an instance
// quarantined by a fence that missed fence_timeout: quarantinedInstance),
// a hung report (a call's device work past its deadline and hang_grace:
// endHung; the supervisor killed the worker) or a synthetic exit (the
// worker died without a word). Once it quarantined a tenant it counts
// nothing more for it while the entry stays; an operator's clearing of
// the entry (quarantined reports false again) starts a new count, so a
// tenant that goes on failing is quarantined again after max_failures
// more. It is safe for concurrent use.
type tenantGuard struct {
	m      *manifest.Manifest
	now    func() time.Time
	poison func(tenant, reason string) // called once per quarantine, outside the lock
	// quarantined reports whether the tenant's entry is in the shared
	// quarantine (nil: as long as this guard put it there).
	quarantined func(tenant string) bool

	mu       sync.Mutex
	seen     map[string]int         // worker → failures counted so far
	fails    map[string][]time.Time // tenant → its failures within the window
	poisoned map[string]bool
}

func newTenantGuard(m *manifest.Manifest, now func() time.Time, poison func(tenant, reason string)) *tenantGuard {
	return &tenantGuard{m: m, now: now, poison: poison, seen: map[string]int{}, fails: map[string][]time.Time{}, poisoned: map[string]bool{}}
}

// changed is the supervisor's OnChange hook.
func (g *tenantGuard) changed(st supervise.WorkerStatus) {
	if st.Tenant == "" {
		return
	}
	total := st.DeviceLosses + st.Hangs + st.SyntheticExits
	g.mu.Lock()
	n := total - g.seen[st.Name]
	if n > 0 && g.poisoned[st.Tenant] && g.quarantined != nil && !g.quarantined(st.Tenant) {
		// Cleared since: the failures before the clear are forgiven.
		g.poisoned[st.Tenant] = false
		g.fails[st.Tenant] = nil
	}
	if n <= 0 || g.poisoned[st.Tenant] {
		g.seen[st.Name] = max(total, g.seen[st.Name])
		g.mu.Unlock()
		return
	}
	g.seen[st.Name] = total
	pol := g.m.TenantPolicy(st.Tenant)
	now := g.now()
	list := g.fails[st.Tenant]
	for range n {
		list = append(list, now)
	}
	list = slices.DeleteFunc(list, func(t time.Time) bool { return now.Sub(t) > pol.FailureWindow })
	g.fails[st.Tenant] = list
	hit := len(list) >= pol.MaxFailures
	if hit {
		g.poisoned[st.Tenant] = true
	}
	g.mu.Unlock()
	if hit {
		g.poison(st.Tenant, fmt.Sprintf("tenant %s: %d failures of its workers within %s (max_failures %d; last on worker %s)",
			st.Tenant, len(list), pol.FailureWindow, pol.MaxFailures, st.Name))
	}
}

// quarantinedInstance names an instance of d's sessions that is
// quarantined (its fence missed fence_timeout: device work that cannot
// be proven finished, such as a hung kernel), and why; "" when none is.
// A tenant's worker ends itself then: a hung kernel cannot be stopped
// from inside its process, only by the process's end.
func quarantinedInstance(d *deploy.Deployment) string {
	for _, st := range d.Statuses() {
		for _, in := range st.Instances {
			if in.State == "quarantined" {
				return fmt.Sprintf("session %s instance %d quarantined: %s", st.Name, in.Index, in.Reason)
			}
		}
	}
	return ""
}

// needsWorker lists the sessions that plain `serve` (one process, no
// --supervise) refuses to run, each with why: a cuda session that runs
// vendor PTX kernels ([[kernel]] with ptx), whose faults and hangs only
// a process boundary contains (docs/security.md). A session's tenant
// alone is no reason: a tenant without vendor device code runs
// in-process (its sessions share the process's failure domain), and Wasm
// vendor kernels on sim are contained by wazero.
func needsWorker(m *manifest.Manifest) []string {
	var out []string
	for i := range m.Sessions {
		s := &m.Sessions[i]
		for _, dev := range s.Devices {
			if md := m.Device(dev); md != nil && md.Backend == manifest.BackendCUDA {
				if k := vendorPTXOn(m, s); k != "" {
					out = append(out, fmt.Sprintf("session %q runs vendor PTX kernel %q on cuda device %q", s.Name, k, dev))
					break
				}
			}
		}
	}
	return out
}

// vendorPTXOn names a vendor PTX kernel session s lists ([[kernel]]
// with ptx), "" for none.
var vendorPTXOn = func(m *manifest.Manifest, s *manifest.Session) string {
	for _, name := range s.Programs {
		if k := m.KernelNamed(name); k != nil && k.PTX != "" {
			return name
		}
	}
	return ""
}

// envLocalSocket is the environment variable that gives a worker of
// `serve --supervise` the path of its local transport's socket
// (internal/localcall).
const envLocalSocket = "STAGEHOST_LOCAL_SOCKET"

// localRoutes is the supervisor's side of the local transport: a client
// per worker socket, and the choice of a ready worker that serves a
// session (in turn, when several do).
type localRoutes struct {
	front   *lattice.Front // for the calls' client spans
	sup     atomic.Pointer[supervise.Supervisor]
	clients map[string]*localcall.Client // worker → client
	hosts   map[string]string            // worker → its host id
	next    atomic.Uint64
	logger  *slog.Logger
}

// newLocalRoutes returns the routes to the workers' sockets (worker →
// path). A call's error names its worker; the connection's error behind
// it (localcall.ConnError: the socket's path, the net error) goes to
// logger only.
func newLocalRoutes(front *lattice.Front, sockets, hosts map[string]string, m *manifest.Manifest, logger *slog.Logger) *localRoutes {
	r := &localRoutes{front: front, clients: map[string]*localcall.Client{}, hosts: hosts, logger: logger}
	cfg := localcall.NewClientConfig().WithMaxAnswer(maxLocalAnswer(m))
	for w, path := range sockets {
		r.clients[w] = localcall.NewClient(path, cfg.WithWorker(w))
	}
	return r
}

// maxLocalAnswer is the largest answer the supervisor takes from a
// worker: the largest output_limit of m's sessions (a worker's stage
// output is bounded by its session's), and 64 KiB for an error's
// message.
func maxLocalAnswer(m *manifest.Manifest) int64 {
	const message = 64 << 10
	var out int64
	for _, s := range m.Sessions {
		out = max(out, s.OutputLimit)
	}
	if out > math.MaxInt64-message {
		return math.MaxInt64
	}
	return out + message
}

// route is the service's LocalRoute.
func (r *localRoutes) route(ctx context.Context, session string, input []byte) ([]byte, bool, error) {
	sup := r.sup.Load()
	if sup == nil {
		return nil, false, nil
	}
	var ready []string
	for _, st := range sup.Status() {
		if st.State == supervise.StateReady && slices.Contains(st.Sessions, session) && r.clients[st.Name] != nil {
			ready = append(ready, st.Name)
		}
	}
	if len(ready) == 0 {
		return nil, false, nil
	}
	w := ready[int(r.next.Add(1)%uint64(len(ready)))]
	carrier := map[string][]string{}
	cctx, end := r.front.StartLocal(ctx, session, carrier)
	out, err := r.clients[w].Call(cctx, session, requestid.FromContext(ctx), carrier, input)
	if errors.Is(err, localcall.ErrNotSent) {
		end("", err)
		return nil, false, nil
	}
	end(r.hosts[w], err)
	if ce := (*localcall.ConnError)(nil); errors.As(err, &ce) {
		r.logger.Warn("local call: the worker's connection failed", "worker", w, "session", session,
			"request_id", requestid.FromContext(ctx), "class", ce.Class, "err", ce.Err)
	}
	return out, true, err
}

func (r *localRoutes) close() {
	for _, c := range r.clients {
		c.Close()
	}
}

// serveLocal serves the worker's local transport on the socket the
// supervisor named (envLocalSocket), with host's calls (which keep the
// shared quarantine's refusals); stop ends it (the calls in progress
// have their context cancelled, and their answers are not delivered:
// localcall.Serve). Without the variable it serves nothing.
func serveLocal(host *lattice.Host, m *manifest.Manifest, _ *slog.Logger) (stop func(), err error) {
	path := os.Getenv(envLocalSocket)
	if path == "" {
		return func() {}, nil
	}
	ln, err := localcall.Listen(path)
	if err != nil {
		return nil, err
	}
	maxInput := int64(manifest.MaxInputSize)
	for _, s := range m.Sessions {
		maxInput = max(maxInput, s.MaxInput)
	}
	call := func(ctx context.Context, c localcall.Call) ([]byte, error) {
		return host.CallLocal(ctx, c.Session, c.RequestID, c.Traceparent, c.Tracestate, c.Input)
	}
	stopServe := localcall.Serve(ln, call, maxInput)
	return func() { stopServe(); _ = os.Remove(path) }, nil
}
