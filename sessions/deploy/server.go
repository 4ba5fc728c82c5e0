package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stagehost/stagehost/host/metrics"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/sessions/manifest"
	"github.com/stagehost/stagehost/stages"
)

// MaxRequestBody bounds a run request's input: the bound of a manifest's
// input files.
const MaxRequestBody = manifest.MaxInputSize

// Server is the HTTP service over a deployment:
//
//	POST /v1/sessions/{name}/run      body = input; 200 with the output bytes
//	GET  /v1/sessions                 every session with its state
//	GET  /v1/sessions/{name}          one session
//	POST /v1/residents/{name}/start   202 with the run's id and state
//	GET  /v1/residents/{name}         the resident's runs
//	GET  /metrics                     Prometheus metrics
//	GET  /debug/trace                 the trace as Chrome trace-event JSON
//	GET  /healthz                     200 "ok"
//
// Errors are JSON {"error", "class", "code"} with a status by error class:
// client error 422, InvalidArgument 400, NotFound 404, OutOfBudget 413,
// Busy 429, DeadlineExceeded 504, DeviceLost 503, a session that could not
// be created ([ErrUnavailable], class "unavailable") 503, others 500.
//
// Besides the runtime's metrics, it exports stagehost_session_runs_total
// and stagehost_session_run_seconds by session, and
// stagehost_session_up{session}: 1 while the session is ready, 0 when it
// is quarantined or could not be created.
type Server struct {
	d        *Deployment
	logger   *slog.Logger
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	mux      *http.ServeMux
	handler  http.Handler

	accepted, answered atomic.Uint64
}

// NewServer builds the service's handler over d.
func NewServer(d *Deployment, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{d: d, logger: logger, registry: prometheus.NewRegistry(), mux: http.NewServeMux()}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stagehost_session_runs_total", Help: "Session runs by outcome (ok, client_error, or an error class).",
	}, []string{"session", "outcome"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "stagehost_session_run_seconds", Help: "Session run latency, including the wait for the session.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
	}, []string{"session"})
	s.registry.MustRegister(s.requests, s.latency, sessionCollector{d}, metrics.NewCollector(d.Runtime),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.mux.HandleFunc("POST /v1/sessions/{name}/run", s.run)
	s.mux.HandleFunc("GET /v1/sessions", s.listSessions)
	s.mux.HandleFunc("GET /v1/sessions/{name}", s.getSession)
	s.mux.HandleFunc("POST /v1/residents/{name}/start", s.startResident)
	s.mux.HandleFunc("GET /v1/residents/{name}", s.getResident)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /debug/trace", s.trace)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.accepted.Add(1)
		defer s.answered.Add(1)
		s.mux.ServeHTTP(w, r)
	})
	return s
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Counts reports how many requests reached a handler and how many of
// those were answered; after a graceful shutdown they are equal.
func (s *Server) Counts() (accepted, answered uint64) {
	return s.accepted.Load(), s.answered.Load()
}

// Serve serves on ln until ctx ends, then shuts down gracefully: it stops
// accepting connections and waits (up to grace) for every accepted
// request, whose stages run to completion and fence as usual, to be
// answered.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.logger.Info("shutting down: no new connections; finishing accepted requests", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	sess := s.d.Session(name)
	if sess == nil {
		writeError(w, hw.Errorf(hw.ErrNotFound, "no session %q", name))
		return
	}
	input, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBody))
	if err != nil {
		writeError(w, hw.Errorf(hw.ErrOutOfBudget, "request body: %v", err))
		return
	}
	start := time.Now()
	out, err := sess.Run(r.Context(), input)
	s.latency.WithLabelValues(name).Observe(time.Since(start).Seconds())
	s.requests.WithLabelValues(name, outcome(err)).Inc()
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
}

func outcome(err error) string {
	var ce *stages.ClientError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce):
		return "client_error"
	case errors.Is(err, ErrUnavailable):
		return classUnavailable
	}
	if c := hw.ClassOf(err); c != nil {
		return c.Error()
	}
	return "error"
}

func (s *Server) listSessions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"sessions": s.d.Statuses()})
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	sess := s.d.Session(r.PathValue("name"))
	if sess == nil {
		writeError(w, hw.Errorf(hw.ErrNotFound, "no session %q", r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, sess.Status())
}

func (s *Server) startResident(w http.ResponseWriter, r *http.Request) {
	res := s.d.Resident(r.PathValue("name"))
	if res == nil {
		writeError(w, hw.Errorf(hw.ErrNotFound, "no resident session %q", r.PathValue("name")))
		return
	}
	// The run outlives the request: its joins continue in the background.
	run, err := res.Start(context.WithoutCancel(r.Context()))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"resident": res.Spec.Name, "id": run.ID, "state": "running"})
}

func (s *Server) getResident(w http.ResponseWriter, r *http.Request) {
	res := s.d.Resident(r.PathValue("name"))
	if res == nil {
		writeError(w, hw.Errorf(hw.ErrNotFound, "no resident session %q", r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"resident": res.Spec.Name, "rounds": res.Spec.Rounds, "runs": res.Runs()})
}

func (s *Server) trace(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if err := s.d.Runtime.Tracer().WriteChromeTrace(w); err != nil {
		s.logger.Warn("writing trace", "err", err)
	}
}

// HTTPStatus maps an error to the HTTP status the service answers with.
func HTTPStatus(err error) int {
	var ce *stages.ClientError
	if errors.As(err, &ce) {
		return http.StatusUnprocessableEntity
	}
	if errors.Is(err, ErrUnavailable) {
		return http.StatusServiceUnavailable
	}
	switch hw.ClassOf(err) {
	case hw.ErrInvalidArgument:
		return http.StatusBadRequest
	case hw.ErrNotFound:
		return http.StatusNotFound
	case hw.ErrOutOfBudget:
		return http.StatusRequestEntityTooLarge
	case hw.ErrBusy:
		return http.StatusTooManyRequests
	case hw.ErrDeadlineExceeded:
		return http.StatusGatewayTimeout
	case hw.ErrDeviceLost:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	body := map[string]any{"error": err.Error()}
	var ce *stages.ClientError
	if errors.As(err, &ce) {
		body["class"], body["code"] = "client_error", ce.Code
	} else if errors.Is(err, ErrUnavailable) {
		body["class"] = classUnavailable
	} else if c := hw.ClassOf(err); c != nil {
		body["class"] = c.Error()
	}
	writeJSON(w, HTTPStatus(err), body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// classUnavailable is the error class, in answers and metrics, of a call
// to a session that could not be created.
const classUnavailable = "unavailable"

// sessionUp describes stagehost_session_up.
var sessionUp = prometheus.NewDesc("stagehost_session_up",
	"1 while the session is ready; 0 when it is quarantined or could not be created.", []string{"session"}, nil)

// sessionCollector exports every session's state at scrape time.
type sessionCollector struct{ d *Deployment }

func (c sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sessionUp }

func (c sessionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.d.Statuses() {
		up := 0.0
		if st.State == "ready" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sessionUp, prometheus.GaugeValue, up, st.Name)
	}
}
