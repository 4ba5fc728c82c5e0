package service

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// Lattice is what the HTTP service needs of the lattice its process
// joined (docs/lattice.md): `stagehost serve` sets it with
// [Server.SetLattice] when the manifest has a [lattice] table. Package
// internal/lattice implements it (lattice.Member), so that this package
// does not import the lattice's.
type Lattice interface {
	// Call runs a call to a session: on a free local instance, else
	// through the lattice on another host that serves the session, with
	// ctx's trace context (the run's span; docs/lattice.md, "Tracing").
	// traceparent is the W3C traceparent the call was sent to the other
	// host with (the front makes one when ctx has none), or ctx's when it
	// was sent to no host ("" without one): the service logs it. Errors
	// of another host (or of the lattice) are [*errdefs.RemoteError]s.
	Call(ctx context.Context, session string, input []byte) (out []byte, traceparent string, err error)
	// Known reports whether a live host of the lattice has the session, or
	// one had it since this process joined (a call to it is then routed,
	// or refused 503 unavailable with the reason).
	Known(session string) bool
	// StartResident starts a run of a resident session that a live host
	// of the lattice has (this process's host first, when it has it),
	// sending the start once: a start is not idempotent. out is the
	// host's answer, a [deploy.ResidentStart] as JSON. Errors are
	// [*errdefs.RemoteError]s: unavailable when no live host has the resident or
	// none responds, deadline_exceeded when the host did not answer in
	// time (the run may have started), or the host's refusal (busy,
	// device_lost, …).
	StartResident(ctx context.Context, resident string) (out []byte, err error)
	// ResidentStatus is a resident session's state, a [deploy.ResidentStatus]
	// as JSON, from a live host that has it (this process's host first).
	// Run ids are the host's own: with several hosts having the resident,
	// each answers for its own runs. Errors as StartResident's.
	ResidentStatus(ctx context.Context, resident string) (out []byte, err error)
	// KnownResident reports whether a live host of the lattice has the
	// resident session, or one had it since this process joined (a start
	// or status request for it is then routed, or refused 503
	// unavailable with the reason).
	KnownResident(resident string) bool
	// Ready is nil while the process is connected to the lattice, else
	// why not.
	Ready() error
	// Hosts lists the live hosts' heartbeat records.
	Hosts() []lattice.HostRecord
	// Quarantined lists the lattice's shared quarantine.
	Quarantined() []lattice.Poison
	// Clear takes a module out of the shared quarantine; found is false
	// when it was not in it.
	Clear(ctx context.Context, sha256 string) (found bool, err error)
	// Stats counts the calls routed, by route: local, remote, refused,
	// no_responders, host_gone, unanswered.
	Stats() map[string]uint64
}

// sessionSpecs is what a [Lattice] may offer besides: the manifest
// spec of a session this process routes but does not have (a
// supervisor's, from the manifest its workers read), so that the
// session's max_input applies where the call arrives, before its body is
// routed (and a Stagehost-Deadline is read against its deadline, as on
// the host that runs it). nil for a session it has no spec of.
type sessionSpecs interface {
	SessionSpec(session string) *manifest.Session
}

// latticeSwapper is what a [Lattice] may offer besides: model control
// across the lattice (lattice.Member's). POST /v1/sessions/{name}/swap
// goes through it when it is there: a swap of every host of the lattice,
// or with hostOnly of this host only, answered with a
// [lattice.SwapAnswer].
type latticeSwapper interface {
	SwapSession(ctx context.Context, session, ref string, hostOnly bool) (lattice.SwapAnswer, error)
}

type latticeBox struct{ l Lattice }

// SetLattice routes POST /v1/sessions/{name}/run through l, and the
// /v1/residents/{name} routes of a resident this process does not have;
// serves /v1/lattice/hosts and /v1/lattice/quarantine from it, adds its
// connection state to /readyz and its counts to /metrics. Call it once,
// after [Server.Attach].
func (s *Server) SetLattice(l Lattice) {
	s.registry.MustRegister(latticeCollector{l})
	s.lattice.Store(&latticeBox{l})
}

func (s *Server) latticeOf() Lattice {
	if b := s.lattice.Load(); b != nil {
		return b.l
	}
	return nil
}

func (s *Server) latticeRoutes() {
	s.route("GET /v1/lattice/hosts", scopeAdmin, s.latticeHosts)
	s.route("GET /v1/lattice/quarantine", scopeAdmin, s.latticeQuarantine)
	s.route("DELETE /v1/lattice/quarantine/{sha256}", scopeAdmin, s.latticeClear)
}

var errNoLattice = &serviceError{errdefs.ClassNotFound, "this host is not in a lattice (its manifest has no [lattice] table)"}

func (s *Server) latticeHosts(w http.ResponseWriter, r *http.Request) {
	l := s.latticeOf()
	if l == nil {
		s.writeError(w, r, errNoLattice)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": l.Hosts()})
}

func (s *Server) latticeQuarantine(w http.ResponseWriter, r *http.Request) {
	l := s.latticeOf()
	if l == nil {
		s.writeError(w, r, errNoLattice)
		return
	}
	entries := []quarantineEntry{}
	for _, p := range l.Quarantined() {
		e := quarantineEntry{Poison: p, Kind: "module"}
		if name, ok := strings.CutPrefix(p.SHA256, lattice.TenantKey("")); ok {
			e.Kind, e.Tenant = "tenant", name
		}
		entries = append(entries, e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"quarantine": entries})
}

// quarantineEntry is an entry of GET /v1/lattice/quarantine: the
// lattice's Poison (its key in "sha256": a module's sha256, or
// lattice.TenantKey of a tenant), and which kind of entry it is.
type quarantineEntry struct {
	lattice.Poison
	// Kind is "module" or "tenant".
	Kind string `json:"kind"`
	// Tenant is the tenant's name, for a tenant's entry.
	Tenant string `json:"tenant,omitempty"`
}

func (s *Server) latticeClear(w http.ResponseWriter, r *http.Request) {
	l := s.latticeOf()
	if l == nil {
		s.writeError(w, r, errNoLattice)
		return
	}
	sha := r.PathValue("sha256")
	// A module's sha256, or a tenant's entry (lattice.TenantKey).
	if b, err := hex.DecodeString(sha); (err != nil || len(b) != 32) && !validTenantKey(sha) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "%q is not a module sha256 (64 hex digits) nor a tenant's entry (tenant.NAME)", sha))
		return
	}
	what := "module " + sha
	if name, ok := strings.CutPrefix(sha, lattice.TenantKey("")); ok {
		what = "tenant " + name
	}
	found, err := l.Clear(r.Context(), sha)
	switch {
	case err != nil:
		s.writeError(w, r, &serviceError{errdefs.ClassUnavailable, fmt.Sprintf("clearing %s: %v", what, err)})
	case !found:
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "%s is not in the lattice's quarantine", what))
	default:
		s.logger.Warn("lattice quarantine cleared", "sha256", sha, "request_id", requestid.FromContext(r.Context()))
		writeJSON(w, http.StatusOK, map[string]any{"cleared": sha})
	}
}

// runLattice is POST /v1/sessions/{name}/run in a lattice: a session
// this host does not have is routed too, when a live host of the lattice
// has it (404 only when none had it since this process joined).
func (s *Server) runLattice(w http.ResponseWriter, r *http.Request, l Lattice, c runCodec) {
	name := r.PathValue("name")
	sess := s.d.Pool(name)
	if sess == nil && !l.Known(name) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q on this host or on any live host of its lattice", name))
		return
	}
	// The session's own limits where this process knows its spec (its
	// own session, or a supervisor's from the manifest); else the
	// default max_input, and the host that runs the call applies the
	// session's.
	limit, manifestDeadline, limitName := int64(maxRequestBody), time.Duration(0),
		fmt.Sprintf("the default max_input (session %q is another host's, whose own max_input applies there)", name)
	spec := (*manifest.Session)(nil)
	if sess != nil {
		spec = sess.Spec
	} else if ss, ok := l.(sessionSpecs); ok {
		spec = ss.SessionSpec(name)
	}
	maxInput := limit
	if spec != nil {
		maxInput, manifestDeadline = spec.MaxInput, spec.Deadline
		limit, limitName = c.bodyLimit(name, spec.MaxInput)
	}
	if r.ContentLength > limit {
		refuseUnread(w, r)
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrOutOfBudget, "the request body of %d bytes is larger than %s of %d bytes", r.ContentLength, limitName, limit))
		return
	}
	// The host that runs the call applies its own manifest deadline too.
	ctx, cancel, err := callContext(r, manifestDeadline)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer cancel()
	if _, ok := ctx.Deadline(); !ok && manifestDeadline > 0 {
		// Through the lattice a call has one absolute deadline, over its
		// wait for an instance, its trip and its run: the session's
		// deadline from the request's arrival, where this process knows
		// the session (else the front's default).
		var cancelSession context.CancelFunc
		ctx, cancelSession = context.WithTimeout(ctx, manifestDeadline)
		defer cancelSession()
	}
	body, err := readRunBody(w, r, limitName, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var mod *stages.Module
	if sess != nil {
		mod = sess.Module()
	}
	input, err := c.input(r, name, mod, maxInput, body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	out, tp, err := l.Call(ctx, name, input)
	if sess != nil {
		s.latency.WithLabelValues(name).Observe(time.Since(start).Seconds())
	}
	s.logger.Log(ctx, slog.LevelDebug, "lattice run", "session", name, "traceparent", tp, "request_id", requestid.FromContext(ctx), "took", time.Since(start))
	if err != nil {
		var ce *errdefs.RemoteError
		if errors.As(err, &ce) {
			s.writeClassError(w, r, ce, tp)
			return
		}
		s.writeError(w, r, err)
		return
	}
	if err := c.answer(w, out); err != nil {
		s.writeError(w, r, err)
	}
}

// writeClassError answers an error another host (or the lattice) gave,
// as writeError answers the service's own.
func (s *Server) writeClassError(w http.ResponseWriter, r *http.Request, ce *errdefs.RemoteError, tp string) {
	class := ce.Class
	if r.Context().Err() != nil && errors.Is(r.Context().Err(), context.Canceled) {
		class = errdefs.ClassClientClosed
	}
	status := classStatus(class)
	body := ErrorBody{Error: ce.Message, Class: class, Code: ce.Code, RequestID: requestid.FromContext(r.Context())}
	if body.Error == "" {
		body.Error = class
	}
	// Through the lattice every 503 may pass: another host, or this one
	// restarted, may serve the next try.
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	}
	spanError(r.Context(), class, ce.Message, ce.Host)
	s.logger.Log(r.Context(), level, "request failed", "request_id", body.RequestID, "method", r.Method, "path", r.URL.Path,
		"class", class, "status", status, "host", ce.Host, "traceparent", tp, "err", ce.Message)
	writeErrorBody(w, r, status, body)
}

var (
	latticeCalls = prometheus.NewDesc("stagehost_lattice_calls_total",
		"Session calls routed by this host's lattice front, by route: local (a free local instance), remote (through the lattice), refused (no live host serves the session, or its module is quarantined lattice-wide), no_responders, host_gone (lost with the host that took it), unanswered.",
		[]string{"route"}, nil)
	latticeConnected = prometheus.NewDesc("stagehost_lattice_connected",
		"1 while the process is connected to its lattice's NATS server.", nil, nil)
)

type latticeCollector struct{ l Lattice }

func (c latticeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- latticeCalls
	ch <- latticeConnected
}

func (c latticeCollector) Collect(ch chan<- prometheus.Metric) {
	stats := c.l.Stats()
	routes := make([]string, 0, len(stats))
	for k := range stats {
		routes = append(routes, k)
	}
	sort.Strings(routes)
	for _, k := range routes {
		ch <- prometheus.MustNewConstMetric(latticeCalls, prometheus.CounterValue, float64(stats[k]), k)
	}
	up := 0.0
	if c.l.Ready() == nil {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(latticeConnected, prometheus.GaugeValue, up)
}

// validTenantKey says whether key is a tenant's entry of the shared
// quarantine: lattice.TenantKey of a tenant name.
func validTenantKey(key string) bool {
	name, ok := strings.CutPrefix(key, lattice.TenantKey(""))
	return ok && manifest.ValidTenantName(name)
}
