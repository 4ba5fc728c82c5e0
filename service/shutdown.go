package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// errCutOff is what a handler's writes return once its request was
// answered 503 at the end of the grace period.
var errCutOff = errors.New("the request was answered 503: the service stopped when its grace period ran out")

// cutOffMessage is the error of the 503 a request in flight gets when the
// grace period of a shutdown runs out.
const cutOffMessage = "the service stopped before the call finished (its shutdown grace period ran out); it may not have run, or run in part: retry on another host"

// answerGuard is the ResponseWriter a handler writes through: it lets the
// shutdown answer a request whose handler is still running, once and
// only once. The handler's headers are its own map until it writes, so
// that the shutdown never races with it on the real one.
type answerGuard struct {
	w      http.ResponseWriter
	header http.Header
	id     string

	mu       sync.Mutex
	started  bool // the handler wrote its status
	cut      bool // the shutdown answered (or broke) the request
	finished bool // the handler returned
}

func (g *answerGuard) Header() http.Header { return g.header }

// start copies the handler's headers into the real ones and writes the
// status; g.mu is held.
func (g *answerGuard) start(code int) {
	g.started = true
	h := g.w.Header()
	for k, v := range g.header {
		h[k] = v
	}
	g.w.WriteHeader(code)
}

func (g *answerGuard) WriteHeader(code int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut || g.started {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An informational answer: the real one is still to come.
		h := g.w.Header()
		for k, v := range g.header {
			h[k] = v
		}
		g.w.WriteHeader(code)
		return
	}
	g.start(code)
}

func (g *answerGuard) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut {
		return 0, errCutOff
	}
	if !g.started {
		g.start(http.StatusOK)
	}
	return g.w.Write(p)
}

// Flush flushes what the handler wrote (http.Flusher).
func (g *answerGuard) Flush() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut {
		return
	}
	if !g.started {
		g.start(http.StatusOK)
	}
	_ = http.NewResponseController(g.w).Flush()
}

// Unwrap is for http.ResponseController (read deadlines).
func (g *answerGuard) Unwrap() http.ResponseWriter { return g.w }

// finish marks the handler returned, and reports whether the request is
// the handler's to count as answered (the shutdown did not cut it off).
func (g *answerGuard) finish() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.finished = true
	return !g.cut
}

// cutOff answers the request 503 class unavailable, with Connection:
// close, if its handler is still running and has not begun its answer
// (answered true); one whose answer had begun can only be broken off
// (its connection closes). It does nothing (handled false) when the
// handler returned.
func (g *answerGuard) cutOff() (handled, answered bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished || g.cut {
		return false, false
	}
	g.cut = true
	// Nothing more is read: a handler still reading a slow body stops
	// waiting for it (and net/http does not try to read the rest before
	// the answer).
	_ = http.NewResponseController(g.w).SetReadDeadline(time.Now())
	if g.started {
		return true, false
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetIndent("", "  ")
	_ = enc.Encode(ErrorBody{Error: cutOffMessage, Class: errdefs.ClassUnavailable, RequestID: g.id})
	h := g.w.Header()
	clear(h)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(body.Len()))
	h.Set("Connection", "close")
	h.Set("X-Request-Id", g.id)
	h.Set("Retry-After", "1")
	g.w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = g.w.Write(body.Bytes())
	_ = http.NewResponseController(g.w).Flush()
	return true, true
}

// track registers a request's guard while its handler runs.
func (s *Server) track(g *answerGuard) {
	s.guardsMu.Lock()
	if s.guards == nil {
		s.guards = map[*answerGuard]struct{}{}
	}
	s.guards[g] = struct{}{}
	s.guardsMu.Unlock()
}

func (s *Server) untrack(g *answerGuard) {
	s.guardsMu.Lock()
	delete(s.guards, g)
	s.guardsMu.Unlock()
}

// cutInFlight answers every request still being handled 503 (see
// answerGuard.cutOff) and counts them.
func (s *Server) cutInFlight() {
	s.guardsMu.Lock()
	gs := make([]*answerGuard, 0, len(s.guards))
	for g := range s.guards {
		gs = append(gs, g)
	}
	s.guardsMu.Unlock()
	for _, g := range gs {
		handled, answered := g.cutOff()
		if !handled {
			continue
		}
		s.cutOffCount.Add(1)
		if answered {
			s.answered.Add(1)
		}
		s.logger.Warn("request cut off: the shutdown grace period ran out", "request_id", g.id, "answered_503", answered)
	}
}

// CutOff reports how many requests were still being handled when the
// grace period of [Server.Serve]'s shutdown ran out. Each was answered
// 503 class unavailable (and counted answered by [Server.Counts]) unless
// its answer had already begun: that one's connection was closed
// mid-answer, and it is not counted answered.
func (s *Server) CutOff() uint64 { return s.cutOffCount.Load() }
