package lattice

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/micro"
)

// sessionEndpoint is a session's endpoint on a host, for a session that
// is not exclusive (an exclusive one's is its placement's): a micro
// service of its own, so that it can stop while the session cannot
// serve on this host (every instance quarantined or failed, its module
// quarantined lattice-wide) and start again when it can. A stopped
// endpoint takes the host out of the session's queue group, so the
// lattice's calls go to the hosts that can run them instead of being
// answered 503 here.
type sessionEndpoint struct {
	mu      sync.Mutex
	svc     micro.Service // nil while stopped
	stopped bool          // the host is leaving: never started again
	why     string        // why it is stopped, "" while serving
}

// syncEndpoint is updateEndpoint from a call's goroutine: a change asks
// the heartbeat loop for a heartbeat at once, so that fronts route by it.
func (h *Host) syncEndpoint(hs *hostSession) {
	if h.updateEndpoint(hs) {
		select {
		case h.kick <- struct{}{}:
		default: // one is due already
		}
	}
}

// updateEndpoint starts or stops hs's endpoint as the session can serve
// on this host or not (canServe), and says whether it did. Exclusive
// sessions are left to their placement. The heartbeat loop calls it
// directly, and writes the heartbeat after.
func (h *Host) updateEndpoint(hs *hostSession) (changed bool) {
	if hs.place != nil {
		return false
	}
	ok, why := h.canServe(hs)
	e := &hs.ep
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.stopped:
	case ok && e.svc == nil:
		svc, err := h.startEndpoint(hs)
		if err != nil {
			h.cfg.Logger.Error("lattice: starting a session's endpoint failed; the next heartbeat tries again", "host", h.cfg.ID, "session", hs.name, "err", err)
			e.why = err.Error()
			return false
		}
		e.svc, e.why = svc, ""
		h.cfg.Logger.Info("lattice: serving a session again", "host", h.cfg.ID, "session", hs.name)
		return true
	case !ok && e.svc != nil:
		_ = e.svc.Stop()
		// A round trip: the server has processed the unsubscription
		// before this returns, so a call published after it (by any
		// front) goes to the other hosts.
		_ = h.nc.FlushTimeout(h.cfg.TTL / 3)
		e.svc, e.why = nil, why
		h.cfg.Logger.Info("lattice: stopped taking a session's calls: it cannot serve on this host", "host", h.cfg.ID, "session", hs.name, "why", why)
		return true
	}
	return false
}

// startEndpoint registers hs's endpoint as a micro service of its own
// (an exclusive session's too, while its placement is held).
func (h *Host) startEndpoint(hs *hostSession) (micro.Service, error) {
	meta := map[string]string{"host": h.cfg.ID, "session": hs.name}
	if hs.place != nil {
		meta["placement"] = placementExclusive
	}
	svc, err := micro.AddService(h.nc, micro.Config{Name: ServiceName(h.cfg.Lattice), Version: "1.0.0",
		Description: "stagehost session " + hs.name, Metadata: meta})
	if err != nil {
		return nil, fmt.Errorf("lattice: micro service for session %q: %w", hs.name, err)
	}
	if err := h.addEndpoint(svc, hs); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

// stopEndpoints stops every session's endpoint for good (the host is
// leaving).
func (h *Host) stopEndpoints() {
	for _, name := range h.names {
		e := &h.sessions[name].ep
		e.mu.Lock()
		e.stopped = true
		if e.svc != nil {
			_ = e.svc.Stop()
			e.svc = nil
		}
		e.mu.Unlock()
	}
}
