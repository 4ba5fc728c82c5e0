package service

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host/metrics"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// maxRequestBody is the default bound of a run request's input: a
// session's max_input when the manifest does not set it.
const maxRequestBody = manifest.MaxInputSize

// Config is the service's configuration: its limits, tokens and TLS. A
// manifest's [service] table gives it ([ConfigFromManifest]); the CLI's
// flags override it. Every route, limit and status is in docs/service.md.
type Config struct {
	// Timeouts of http.Server; 0 means none.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConnections bounds the open connections (0: no bound); past it
	// new connections wait to be accepted.
	MaxConnections int
	// MaxInFlight bounds the /v1/ requests being handled at once (0: no
	// bound); past it a request is answered 429 busy with Retry-After.
	MaxInFlight int
	// DrainDelay is how long, after SIGTERM, the service keeps accepting
	// while /readyz says draining, before it stops accepting.
	DrainDelay time.Duration
	// ReadyQuarantinedShare is the largest share (0..1) of a session's
	// instances that may be quarantined or failed while /readyz says ready.
	ReadyQuarantinedShare float64
	// AdminTokens and InvokeTokens are the bearer tokens of each scope;
	// with none at all, no route needs a token.
	AdminTokens, InvokeTokens []string
	// TLSCert and TLSKey are PEM files; with both set the service speaks
	// HTTPS only. They are read with [LoadKeyPair] when Serve starts.
	TLSCert, TLSKey string
	// TracerProvider records a server span of each session run, a child
	// of the request's traceparent (docs/lattice.md, "Tracing"). Default
	// nil: a no-op provider (the incoming traceparent is still passed to
	// the lattice).
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults of docs/manifest.md's [service].
func DefaultConfig() Config {
	return configFromService(manifest.DefaultService())
}

// ConfigFromManifest returns the configuration m's [service] table gives,
// without the tokens (read them with [deploy.ReadTokens]).
func ConfigFromManifest(m *manifest.Manifest) Config { return configFromService(m.Service) }

// configFromService converts a [service] table, without the tokens.
func configFromService(s manifest.Service) Config {
	return Config{
		ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout,
		MaxConnections: s.MaxConnections, MaxInFlight: s.MaxInFlight,
		DrainDelay: s.DrainDelay, ReadyQuarantinedShare: s.ReadyQuarantinedShare,
		TLSCert: s.TLSCert, TLSKey: s.TLSKey,
	}
}

// Server is the HTTP service over a deployment. Its routes, with the
// scope of token each needs when tokens are configured:
//
//	POST /v1/sessions/{name}/run      invoke  body = input; 200 with the output bytes
//	GET  /v1/sessions                 invoke  every session with its state
//	GET  /v1/sessions/{name}          invoke  one session
//	GET  /v1/sessions/{name}/ready    invoke  200 when the session can run, else 503 and why
//	POST /v1/residents/{name}/start   admin   202 with the run's id and state (another host's: resident_http.go)
//	GET  /v1/residents/{name}         admin   the resident's runs
//	GET  /v1/lattice/hosts            admin   the lattice's live hosts (lattice_http.go; 404 outside a lattice)
//	GET  /v1/lattice/quarantine       admin   the lattice's shared quarantine
//	DELETE /v1/lattice/quarantine/{sha256} admin  clears one module (or tenant.NAME)
//	GET  /v1/workers                  admin   a supervisor's workers (workers_http.go; 404 elsewhere)
//	GET  /v1/status                   admin   the status page's content as JSON (status_workers.go)
//	GET  /metrics                     admin   Prometheus metrics
//	GET  /debug/trace                 admin   the trace as Chrome trace-event JSON
//	GET  /                            admin   the status page (HTML; statuspage.go); POST / signs a browser in
//	GET  /v2, /v2/models, /v2/models/{name}[/versions/{v}][/ready]  invoke  the Open Inference Protocol's metadata (oip.go)
//	POST /v2/models/{name}[/versions/{v}]/infer  invoke  a run with the protocol's tensors, on the run's path (serveRun)
//	GET  /livez, /healthz, /v2/health/live    liveness: 200 while the process serves
//	GET  /readyz, /v2/health/ready            readiness: 200, or 503 with the reasons
//
// Every error is JSON {"error", "class", "request_id"} (and "code" for a
// stage's own failure), with the status of its class (errors.go); unknown
// routes and methods included; under /v2 it is the protocol's {"error"}
// alone. Every response carries X-Request-Id.
//
// Besides the runtime's metrics, it exports stagehost_session_runs_total
// by session and outcome (the class names of errors.go, the same counts
// /v1/sessions shows), stagehost_session_run_seconds by session, and
// stagehost_session_up{session}: 1 while the session is ready, 0 when it
// is quarantined or could not be created.
type Server struct {
	d        *deploy.Deployment
	cfg      Config
	logger   *slog.Logger
	registry *prometheus.Registry
	latency  *prometheus.HistogramVec
	mux      *http.ServeMux
	scopes   map[string]tokenScope // route pattern → the scope it needs
	limited  map[string]bool       // route patterns under max_in_flight
	auth     *authenticator
	inFlight chan struct{}
	handler  http.Handler
	tracer   trace.Tracer // Config.TracerProvider's (trace.go)

	attached           atomic.Bool                     // Attach has run: d, mux, registry and latency are set
	lattice            atomic.Pointer[latticeBox]      // SetLattice: run calls route through the lattice
	workers            atomic.Pointer[workersBox]      // SetWorkers: a supervisor's workers (workers_http.go)
	modelCtl           atomic.Pointer[modelControlBox] // SetModelControl: model control elsewhere (supervisor_model.go)
	state              atomic.Int32                    // stateServing, then stateDraining
	accepted, answered atomic.Uint64
	cutOffCount        atomic.Uint64 // requests the end of the grace period cut off (shutdown.go)
	guardsMu           sync.Mutex
	guards             map[*answerGuard]struct{} // the requests being handled
}

const (
	stateServing = iota
	stateDraining
)

// NewServer builds the service's handler over d with d's manifest's
// [service] configuration and no tokens.
func NewServer(d *deploy.Deployment, logger *slog.Logger) *Server {
	return NewServerConfig(d, logger, ConfigFromManifest(d.Manifest))
}

// NewServerConfig builds the service's handler over d with cfg.
func NewServerConfig(d *deploy.Deployment, logger *slog.Logger, cfg Config) *Server {
	s := NewStartingServer(logger, cfg)
	s.Attach(d)
	return s
}

// NewStartingServer builds the service before its deployment exists, so
// that it can listen while modules load and sessions are made. Until
// [Server.Attach], /livez, /v2/health/live and /healthz answer 200,
// /readyz and /v2/health/ready 503 with status "starting", and every
// other route 503 class unavailable, with Retry-After.
func NewStartingServer(logger *slog.Logger, cfg Config) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{cfg: cfg, logger: logger, scopes: map[string]tokenScope{}, limited: map[string]bool{},
		auth: newAuthenticator(cfg.AdminTokens, cfg.InvokeTokens), tracer: tracing.Tracer(cfg.TracerProvider)}
	if cfg.MaxInFlight > 0 {
		s.inFlight = make(chan struct{}, cfg.MaxInFlight)
	}
	s.handler = http.HandlerFunc(s.serveHTTP)
	return s
}

// Attach gives a server made by [NewStartingServer] its deployment: from
// then on it serves every route. Call it once.
func (s *Server) Attach(d *deploy.Deployment) {
	s.d, s.registry, s.mux = d, prometheus.NewRegistry(), http.NewServeMux()
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "stagehost_session_run_seconds", Help: "Session run latency, including the wait for the session.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
	}, []string{"session"})
	s.registry.MustRegister(s.latency, sessionCollector{d}, d.ResidentCollector(), metrics.NewCollector(d.Runtime, d.DeviceNames()...),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.route("POST /v1/sessions/{name}/run", scopeInvoke, s.run)
	s.route("GET /v1/sessions", scopeInvoke, s.listSessions)
	s.route("GET /v1/sessions/{name}", scopeInvoke, s.getSession)
	s.route("GET /v1/sessions/{name}/ready", scopeInvoke, s.sessionReady)
	s.route("POST /v1/residents/{name}/start", scopeAdmin, s.startResident)
	s.route("GET /v1/residents/{name}", scopeAdmin, s.getResident)
	s.adminRoutes()                                       // model control: admin_http.go
	s.latticeRoutes()                                     // the lattice: lattice_http.go
	s.route("GET /v1/workers", scopeAdmin, s.listWorkers) // a supervisor's: workers_http.go
	s.route("GET /v1/status", scopeAdmin, s.getStatus)    // the status page's content as JSON: status_workers.go
	s.route("GET /metrics", scopeAdmin, promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}).ServeHTTP)
	s.route("GET /debug/trace", scopeAdmin, s.trace)
	s.route("GET /{$}", scopeAdmin, s.statusPage)
	s.route("POST /{$}", scopePublic, s.statusSignIn)
	s.route("GET /livez", scopePublic, live)
	s.route("GET /v2/health/live", scopePublic, live)
	s.route("GET /healthz", scopePublic, healthz)
	s.route("GET /readyz", scopePublic, s.ready)
	s.route("GET /v2/health/ready", scopePublic, s.ready)
	s.oipRoutes() // the Open Inference Protocol: oip.go
	s.attached.Store(true)
}

func live(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"live": true})
}

func healthz(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }

// starting answers while the server has no deployment yet.
func (s *Server) starting(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/livez", "/v2/health/live":
		live(w, r)
	case "/healthz":
		healthz(w, r)
	case "/readyz", "/v2/health/ready":
		writeJSON(w, http.StatusServiceUnavailable, s.Readiness())
	default:
		w.Header().Set("Retry-After", "1")
		s.writeError(w, r, &serviceError{errdefs.ClassUnavailable, "the service is starting: loading modules and creating sessions"})
	}
}

func (s *Server) route(pattern string, scope tokenScope, h http.HandlerFunc) {
	s.mux.HandleFunc(pattern, h)
	s.scopes[pattern] = scope
	_, path, _ := strings.Cut(pattern, " ")
	s.limited[pattern] = strings.HasPrefix(path, "/v1/")
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Counts reports how many requests reached a handler and how many of
// those were answered; after a graceful shutdown they are equal.
func (s *Server) Counts() (accepted, answered uint64) {
	return s.accepted.Load(), s.answered.Load()
}

// LoadKeyPair reads a PEM certificate and its key with
// [manifest.ReadFile] (regular files of at most [manifest.MaxTLSFileSize]
// bytes each; a named pipe or a device is refused, never waited on) and
// parses them.
//
// # Errors
//
// The error of [manifest.ReadFile], naming the file, or of
// [tls.X509KeyPair].
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := manifest.ReadFile(certFile, manifest.MaxTLSFileSize)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := manifest.ReadFile(keyFile, manifest.MaxTLSFileSize)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}

// Serve serves on ln until ctx ends, then shuts down gracefully: /readyz
// says draining for the configured drain delay, then the service stops
// accepting connections and waits (up to grace) for every accepted
// request, whose stages run to completion and fence as usual, to be
// answered. While draining, every answer carries Connection: close.
// When grace runs out, each request still being handled is answered 503
// class unavailable with Connection: close ([Server.CutOff] counts them),
// every connection closes, and Serve returns nil. ln is bounded by MaxConnections; with TLSCert and TLSKey set
// it serves HTTPS.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	srv := &http.Server{Handler: s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.WriteTimeout, IdleTimeout: s.cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelInfo)}
	ln = LimitListener(ln, s.cfg.MaxConnections)
	if s.cfg.TLSCert != "" {
		cert, err := LoadKeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			return err
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	errc := make(chan error, 1)
	go func() {
		if s.cfg.TLSCert != "" {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.state.Store(stateDraining)
	if s.cfg.DrainDelay > 0 {
		s.logger.Info("draining: /readyz answers 503 before the service stops accepting", "drain_delay", s.cfg.DrainDelay)
		t := time.NewTimer(s.cfg.DrainDelay)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			return err
		}
	}
	s.logger.Info("shutting down: no new connections; finishing accepted requests", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// The grace period ran out: every request still being handled is
		// answered 503 now, and the connections close.
		s.cutInFlight()
		err = srv.Close()
	}
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// --- the request pipeline ---

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recorder records the status and the bytes written, for the access log.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) serveHTTP(rw http.ResponseWriter, r *http.Request) {
	s.accepted.Add(1)
	start := time.Now()
	id := r.Header.Get("X-Request-Id")
	if !requestid.Valid(id) {
		id = newRequestID()
	}
	// The handler writes through a guard, so that the end of a shutdown's
	// grace period can answer the request if the handler has not
	// (shutdown.go); the request counts as answered once, either way.
	g := &answerGuard{w: rw, header: http.Header{}, id: id}
	s.track(g)
	defer func() {
		s.untrack(g)
		if g.finish() {
			s.answered.Add(1)
		}
	}()
	var w http.ResponseWriter = g
	w.Header().Set("X-Request-Id", id)
	if s.state.Load() == stateDraining {
		// While draining, every answer closes its connection, so that a
		// client opens a new one for its next request (refused once the
		// listener closes) instead of sending it on one the shutdown
		// closes under it.
		w.Header().Set("Connection", "close")
	}
	r = r.WithContext(requestid.With(r.Context(), id))
	rec := &recorder{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.logger.Error("handler panicked", "request_id", id, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if rec.status == 0 {
				s.writeError(rec, r, &serviceError{errdefs.ClassInternal, "internal error (request " + id + ")"})
			}
		}
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		if r.Context().Err() != nil && errors.Is(r.Context().Err(), context.Canceled) && status >= 400 {
			status = errdefs.StatusClientClosed
		}
		// Probes come every few seconds: a successful one is logged at
		// debug only.
		level := slog.LevelInfo
		if probePaths[r.URL.Path] && status < 400 {
			level = slog.LevelDebug
		}
		s.logger.Log(r.Context(), level, "http request", "method", r.Method, "path", r.URL.Path, "status", status,
			"duration", time.Since(start), "bytes", rec.bytes, "request_id", id, "remote", r.RemoteAddr)
	}()
	s.dispatch(rec, r)
}

// probePaths are the liveness and readiness routes.
var probePaths = map[string]bool{"/livez": true, "/healthz": true, "/readyz": true, "/v2/health/live": true, "/v2/health/ready": true}

func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	if !s.attached.Load() {
		s.starting(w, r)
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		// No route: the mux answers 404, or 405 with Allow; answer the
		// same in JSON.
		probe := &probeWriter{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", probe.header.Get("Allow"))
			s.writeError(w, r, &serviceError{errdefs.ClassMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, probe.header.Get("Allow"))})
			return
		}
		if probe.status >= 300 && probe.status < 400 { // the mux's redirect of a path to its clean form
			for k, v := range probe.header {
				w.Header()[k] = v
			}
			w.WriteHeader(probe.status)
			return
		}
		s.writeError(w, r, &serviceError{errdefs.ClassNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
		return
	}
	if err := s.authorize(r, pattern); err != nil {
		if Class(err) == errdefs.ClassUnauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="stagehost"`)
		}
		if !s.signInInstead(w, r, pattern, err) {
			s.writeError(w, r, err)
		}
		return
	}
	if s.inFlight != nil && s.limited[pattern] {
		select {
		case s.inFlight <- struct{}{}:
			defer func() { <-s.inFlight }()
		default:
			w.Header().Set("Retry-After", "1")
			refuseUnread(w, r)
			s.writeError(w, r, &serviceError{errdefs.ClassBusy, fmt.Sprintf("the service is handling its max_in_flight of %d requests; retry later", s.cfg.MaxInFlight)})
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// probeWriter captures the mux's answer for a request without a route.
type probeWriter struct {
	header http.Header
	status int
}

func (p *probeWriter) Header() http.Header { return p.header }
func (p *probeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}
func (p *probeWriter) WriteHeader(code int) { p.status = code }

// --- handlers ---

// DeadlineHeader is the request header that shortens a session call's
// deadline: a Go duration ("250ms"), counted from the request's arrival
// over the wait for an instance and the call. One at or above the
// session's manifest deadline changes nothing.
const DeadlineHeader = "Stagehost-Deadline"

// refuseUnread marks an answer given before the request's body was
// read: the connection closes right after it. Otherwise net/http reads
// the rest of a small body before it writes the answer, and after it,
// so a client whose body is slow to come (or never comes) would get its
// refusal only at the read timeout, and hold its connection (and a
// graceful shutdown) until then.
func refuseUnread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 {
		return
	}
	w.Header().Set("Connection", "close")
	// Nothing more is read from this connection: the server's discard of
	// the unread body fails at once, and the connection closes.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// readRunBody reads a run's body, at most limit bytes: past it an
// out_of_budget error, as a streamed body passes the limit. limitName
// names the limit in the error (`session "s"'s max_input`).
func readRunBody(w http.ResponseWriter, r *http.Request, limitName string, limit int64) ([]byte, error) {
	input, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, errdefs.Errorf(errdefs.ErrOutOfBudget, "the request body is larger than %s of %d bytes", limitName, limit)
		}
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading the request body: %v", err)
	}
	return input, nil
}

// maxInputName names a session's max_input in an error.
func maxInputName(session string) string { return fmt.Sprintf("session %q's max_input", session) }

// callContext is a run call's context: the request's, with the
// Stagehost-Deadline header's deadline where it is shorter than the
// session's manifest deadline (0: unknown here, any is shorter). The
// header shortens a deadline, never lengthens it.
func callContext(r *http.Request, manifestDeadline time.Duration) (context.Context, context.CancelFunc, error) {
	v := r.Header.Get(DeadlineHeader)
	if v == "" {
		return r.Context(), func() {}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil && tooLongDuration(v) {
		// Longer than a Go duration holds (about 292 years): longer
		// than any deadline, so it shortens none.
		d, err = math.MaxInt64, nil
	}
	if err != nil || d <= 0 {
		return nil, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: %q is not a positive duration (for example 250ms)", DeadlineHeader, v)
	}
	if manifestDeadline > 0 && d >= manifestDeadline {
		return r.Context(), func() {}, nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return ctx, cancel, nil
}

// durationSyntax is Go's duration syntax, without a sign or with '+'.
var durationSyntax = regexp.MustCompile(`^\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// tooLongDuration reports whether v is a duration in Go's syntax, not
// negative, that time.ParseDuration refused: only its range can be why.
func tooLongDuration(v string) bool { return durationSyntax.MatchString(v) }

// runCodec is how a run's request body becomes the stage's input and
// the stage's output the answer: /v1's raw bytes (rawCodec), or the Open
// Inference Protocol's tensors (oipCall, oip.go). Everything else of a
// call (its span, the lattice, admission, the deadline, the body limit,
// the latency metric and the session's outcome counts) is serveRun's,
// the one call path of both routes.
type runCodec interface {
	// bodyLimit returns the largest body read for a session of
	// max_input maxInput, and the limit's name in a 413.
	bodyLimit(session string, maxInput int64) (int64, string)
	// input returns the stage's input for the body: for module mod, nil
	// when the session is another host's.
	input(r *http.Request, session string, mod *stages.Module, maxInput int64, body []byte) ([]byte, error)
	// answer writes the stage's output; an error is answered instead.
	answer(w http.ResponseWriter, out []byte) error
}

// rawCodec is /v1/sessions/{name}/run's: the body is the input, the
// output the answer.
type rawCodec struct{}

func (rawCodec) bodyLimit(session string, maxInput int64) (int64, string) {
	return maxInput, maxInputName(session)
}

func (rawCodec) input(_ *http.Request, _ string, _ *stages.Module, _ int64, body []byte) ([]byte, error) {
	return body, nil
}

func (rawCodec) answer(w http.ResponseWriter, out []byte) error {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
	return nil
}

func (s *Server) run(w http.ResponseWriter, r *http.Request) { s.serveRun(w, r, rawCodec{}) }

// serveRun runs session {name} of the request's path, its body turned
// into the input, and the output into the answer, by c.
func (s *Server) serveRun(w http.ResponseWriter, r *http.Request, c runCodec) {
	w, r, end := s.startRun(w, r) // its span: trace.go
	defer end()
	if l := s.latticeOf(); l != nil {
		s.runLattice(w, r, l, c) // lattice_http.go
		return
	}
	name := r.PathValue("name")
	sess := s.d.Pool(name)
	if sess == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", name))
		return
	}
	limit, limitName := c.bodyLimit(name, sess.Spec.MaxInput)
	if r.ContentLength > limit {
		// Refused before a byte of the body is read; the connection closes.
		refuseUnread(w, r)
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrOutOfBudget, "the request body of %d bytes is larger than %s of %d bytes", r.ContentLength, limitName, limit))
		return
	}
	ctx, cancel, err := callContext(r, sess.Spec.Deadline)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer cancel()
	start := time.Now()
	// Admission first: a call that will be refused (queue full, every
	// instance out of service) reads no body and runs nothing.
	turn, err := sess.Acquire(ctx)
	if err != nil {
		refuseUnread(w, r)
		s.writeError(w, r, err)
		return
	}
	defer turn.Release()
	body, err := readRunBody(w, r, limitName, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	input, err := c.input(r, name, turn.Module(), sess.Spec.MaxInput, body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := turn.Run(ctx, input)
	s.latency.WithLabelValues(name).Observe(time.Since(start).Seconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := c.answer(w, out); err != nil {
		s.writeError(w, r, err)
	}
}

func (s *Server) listSessions(w http.ResponseWriter, _ *http.Request) {
	if wk := s.workersOf(); wk != nil {
		writeJSON(w, http.StatusOK, map[string]any{"sessions": wk.Sessions()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": s.d.Statuses()})
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	if wk := s.workersOf(); wk != nil {
		s.supervisorSession(w, r, wk, false)
		return
	}
	sess := s.d.Pool(r.PathValue("name"))
	if sess == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, sess.Status())
}

func (s *Server) startResident(w http.ResponseWriter, r *http.Request) {
	res := s.d.Resident(r.PathValue("name"))
	if res == nil {
		s.remoteResident(w, r, true) // resident_http.go
		return
	}
	// The run outlives the request: its joins continue in the background.
	started, err := res.StartRun(context.WithoutCancel(r.Context()))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, started)
}

func (s *Server) getResident(w http.ResponseWriter, r *http.Request) {
	res := s.d.Resident(r.PathValue("name"))
	if res == nil {
		s.remoteResident(w, r, false) // resident_http.go
		return
	}
	writeJSON(w, http.StatusOK, res.Status())
}

func (s *Server) trace(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if err := s.d.Runtime.Tracer().WriteChromeTrace(w); err != nil {
		s.logger.Warn("writing trace", "err", err)
	}
}

// ErrorBody is the JSON body of every error answer.
type ErrorBody struct {
	Error     string `json:"error"`          // a short message: never a guest or Wasm stack trace
	Class     string `json:"class"`          // the error class (errors.go)
	Code      *int32 `json:"code,omitempty"` // the stage's code, for class client_error
	RequestID string `json:"request_id"`     // the X-Request-Id of the request
}

// writeError answers err as JSON with its class's status. The client gets
// a short message; the full error (with any guest stack trace) goes to
// the log with the request id.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	class := Outcome(r.Context(), err)
	status := classStatus(class)
	body := ErrorBody{Error: deploy.PublicMessage(err), Class: class, RequestID: requestid.FromContext(r.Context())}
	var ce *stages.ClientError
	if errors.As(err, &ce) {
		body.Code = &ce.Code
	}
	setRetryAfter(w, class)
	spanError(r.Context(), class, body.Error, "")
	level := slog.LevelInfo
	if status >= 500 || body.Error != err.Error() {
		level = slog.LevelWarn
	}
	s.logger.Log(r.Context(), level, "request failed", "request_id", body.RequestID, "method", r.Method, "path", r.URL.Path,
		"class", class, "status", status, "err", err.Error())
	writeErrorBody(w, r, status, body)
}

// writeErrorBody writes an error answer: body, or on the Open Inference
// Protocol's routes (/v2…) the protocol's {"error": "…"} (the class
// only in the status, the request id only in X-Request-Id).
func writeErrorBody(w http.ResponseWriter, r *http.Request, status int, body ErrorBody) {
	if isOIP(r) {
		writeJSON(w, status, oipErrorBody{body.Error})
		return
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// sessionUp describes stagehost_session_up.
var sessionUp = prometheus.NewDesc("stagehost_session_up",
	"1 while the session is ready; 0 when it is quarantined or could not be created.", []string{"session"}, nil)

// sessionRuns describes stagehost_session_runs_total.
var sessionRuns = prometheus.NewDesc("stagehost_session_runs_total",
	"Session runs by outcome: ok, or an error class (docs/service.md); the outcomes of /v1/sessions.", []string{"session", "outcome"}, nil)

// sessionCollector exports every session's state and outcome counts at
// scrape time.
type sessionCollector struct{ d *deploy.Deployment }

func (c sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sessionUp; ch <- sessionRuns }

func (c sessionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.d.Statuses() {
		up := 0.0
		if st.State == "ready" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sessionUp, prometheus.GaugeValue, up, st.Name)
		for outcome, n := range st.Outcomes {
			ch <- prometheus.MustNewConstMetric(sessionRuns, prometheus.CounterValue, float64(n), st.Name, outcome)
		}
	}
}

// RequestIDHandler wraps h so that every record logged with the context
// of a request the service serves carries its request_id: guest logs
// (stagehost_log) of the request's stage call included.
func RequestIDHandler(h slog.Handler) slog.Handler { return requestIDHandler{h} }

type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := requestid.FromContext(ctx); id != "" {
		has := false
		r.Attrs(func(a slog.Attr) bool {
			has = has || a.Key == "request_id"
			return !has
		})
		if !has {
			r.AddAttrs(slog.String("request_id", id))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(as)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
