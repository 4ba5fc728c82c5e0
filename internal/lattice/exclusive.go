package lattice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
)

// placement is the state of an exclusive session on a host: a session
// with placement "exclusive" is served by one host of the lattice at a
// time, the holder of its placement claim (PlacementKey). The holder
// serves it on an endpoint of its own (a micro service with that one
// endpoint, so that it can stop without stopping the host's other
// sessions); the other hosts that have the session stand by, its
// instances made and warm, and claim it when the holder lets it go or its
// claim expires.
//
// The claim is a lease. The holder renews it with each heartbeat and
// serves only while its last renewal, counted from when the renewal was
// sent, is younger than half the claim's TTL; the bucket drops a claim
// that was not renewed for the whole TTL, and only then can another host
// create it. So a holder that can no longer renew (its connection or the
// server is gone) stops serving at least half a TTL before anyone else
// can start.
type placement struct {
	mu     sync.Mutex
	claim  *Claim        // held, or nil: standing by
	svc    micro.Service // the endpoint while held
	holder string        // the holder as last seen while standing by ("" unknown)
	why    string        // why the host stands by, for its heartbeat
	// until is when the host stops serving without a renewal (Unix
	// nanoseconds); 0 while standing by.
	until atomic.Int64
}

// holds reports whether the host serves the exclusive session now.
func (p *placement) holds() bool {
	return time.Now().UnixNano() < p.until.Load()
}

// Serves reports whether the host takes calls to session now: it has
// the session, the session can serve, and, for a session with placement
// "exclusive", the host holds its placement claim.
func (h *Host) Serves(session string) bool {
	hs := h.sessions[session]
	if hs == nil {
		return false
	}
	if hs.place != nil && !hs.place.holds() {
		return false
	}
	ok, _ := h.canServe(hs)
	return ok
}

// standby is what the heartbeat says of a session the host has but does
// not serve.
func (p *placement) standby(h *Host) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.why != "":
		return p.why
	case p.holder != "" && p.holder != h.cfg.ID:
		return "placement is exclusive and held by host " + p.holder
	default:
		return "placement is exclusive and not held by this host"
	}
}

// place keeps an exclusive session's claim: a holder renews it (and lets
// it go when its session cannot serve); a host standing by claims it
// when its own session can serve. It runs when the host joins and with
// each heartbeat.
func (h *Host) place(ctx context.Context, hs *hostSession) {
	p := hs.place
	p.mu.Lock()
	defer p.mu.Unlock()
	healthy, why := h.canServe(hs)
	if p.claim != nil {
		if !healthy {
			h.letGo(ctx, hs, "its session cannot serve here: "+why)
			p.why = "placement let go: " + why
			return
		}
		sent := time.Now()
		err := h.claims.Renew(ctx, p.claim)
		if err == nil {
			p.until.Store(sent.Add(h.cfg.ClaimTTL / 2).UnixNano())
			return
		}
		if cur, gerr := h.claims.Get(ctx, p.claim.Key); gerr == nil && cur.Owner != h.cfg.ID {
			// Taken over: the claim expired (this host could not renew
			// it for a whole TTL) and another host holds it now.
			h.stopServing(hs, "another host holds its placement: "+cur.Owner)
			p.claim, p.holder, p.why = nil, cur.Owner, ""
			return
		}
		if !p.holds() {
			h.stopServing(hs, "its placement claim could not be renewed for half its TTL: "+err.Error())
			p.claim, p.why = nil, ""
			return
		}
		h.cfg.Logger.Warn("lattice: renewing a placement claim failed; still serving within the claim's lease", "host", h.cfg.ID, "session", hs.name, "err", err)
		return
	}
	if !healthy {
		p.why = "placement not claimed: " + why
		return
	}
	sent := time.Now()
	cl, err := h.claims.Claim(ctx, PlacementKey(hs.name), h.cfg.ID)
	if errors.Is(err, ErrClaimed) {
		cur, gerr := h.claims.Get(ctx, PlacementKey(hs.name))
		if gerr != nil || cur.Owner != h.cfg.ID {
			p.holder, p.why = "", ""
			if cur != nil {
				p.holder = cur.Owner
			}
			return
		}
		// This host's own claim, whose renewal it lost track of (an
		// update that reached the server but whose answer did not
		// return): adopt it, then renew it.
		cl, err = cur, h.claims.Renew(ctx, cur)
	}
	if err != nil {
		h.cfg.Logger.Warn("lattice: claiming a placement failed", "host", h.cfg.ID, "session", hs.name, "err", err)
		p.why = "placement not claimed: " + err.Error()
		return
	}
	if err := h.startServing(hs); err != nil {
		h.cfg.Logger.Error("lattice: serving an exclusive session failed; letting its placement go", "host", h.cfg.ID, "session", hs.name, "err", err)
		_ = h.claims.Release(ctx, cl)
		p.why = "placement let go: " + err.Error()
		return
	}
	p.claim, p.holder, p.why = cl, h.cfg.ID, ""
	p.until.Store(sent.Add(h.cfg.ClaimTTL / 2).UnixNano())
	h.cfg.Logger.Info("lattice: holding an exclusive session's placement", "host", h.cfg.ID, "session", hs.name)
}

// canServe reports whether hs could take calls on this host: created, its
// module not quarantined lattice-wide, and an instance in service.
func (h *Host) canServe(hs *hostSession) (bool, string) {
	if err := hs.sess.Failed(); err != nil {
		return false, "session failed: " + publicLine(err.Error())
	}
	if p, ok := h.refused(hs); ok {
		return false, refusal(h.cfg.ID, p).Message
	}
	if why := h.unapplied(hs); why != "" {
		return false, why
	}
	st := hs.sess.Status()
	if len(st.Instances)-st.InstancesOut <= 0 {
		return false, fmt.Sprintf("no instance in service: %s", publicLine(st.Reason))
	}
	return true, ""
}

// letGo stops serving an exclusive session and releases its claim, so
// that a host standing by can take it at its next heartbeat. p.mu held.
func (h *Host) letGo(ctx context.Context, hs *hostSession, why string) {
	p := hs.place
	h.stopServing(hs, why)
	if p.claim != nil {
		if err := h.claims.Release(ctx, p.claim); err != nil {
			h.cfg.Logger.Warn("lattice: releasing a placement claim failed; it expires", "host", h.cfg.ID, "session", hs.name, "err", err)
		}
		p.claim = nil
	}
	p.holder = ""
}

// startServing registers the exclusive session's endpoint. p.mu held.
func (h *Host) startServing(hs *hostSession) error {
	svc, err := h.startEndpoint(hs) // endpoints.go
	if err != nil {
		return err
	}
	hs.place.svc = svc
	return nil
}

// stopServing stops the exclusive session's endpoint: calls the server
// delivered but the host did not take yet are not acknowledged, so their
// fronts send them again (to the next holder). p.mu held.
func (h *Host) stopServing(hs *hostSession, why string) {
	p := hs.place
	p.until.Store(0)
	if p.svc == nil {
		return
	}
	_ = p.svc.Stop()
	p.svc = nil
	h.cfg.Logger.Info("lattice: stopped serving an exclusive session", "host", h.cfg.ID, "session", hs.name, "why", why)
}

// stopExclusive stops serving every exclusive session, keeping the
// claims (Close releases them once the calls in flight are answered, so
// that the next holder never runs a call while this host still does).
func (h *Host) stopExclusive() {
	for _, name := range h.names {
		if p := h.sessions[name].place; p != nil {
			// The endpoint only: the calls it took still run under the
			// claim, which releaseClaims lets go of after them.
			p.mu.Lock()
			if p.svc != nil {
				_ = p.svc.Stop()
				p.svc = nil
			}
			p.mu.Unlock()
		}
	}
}

// releaseClaims releases every claim the host holds, so that a host
// standing by takes the session at its next heartbeat instead of after
// the claim's TTL.
func (h *Host) releaseClaims(ctx context.Context) {
	for _, name := range h.names {
		hs := h.sessions[name]
		if hs.place == nil {
			continue
		}
		hs.place.mu.Lock()
		h.letGo(ctx, hs, "the host is leaving the lattice")
		hs.place.mu.Unlock()
	}
}

// watchClaims follows the placement bucket while the host has exclusive
// sessions: when a claim of one of them goes (its holder released it,
// or it expired: a limit marker), the host tries to claim it at once, and
// heartbeats at once if it won, instead of at its next heartbeat.
func (h *Host) watchClaims(ctx context.Context) (stop func(), err error) {
	w, err := h.claims.kv.Watch(ctx, PlacementKey("*"), jetstream.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("lattice: watching the placement claims: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() == jetstream.KeyValuePut {
				continue
			}
			hs := h.sessions[strings.TrimPrefix(e.Key(), PlacementKey(""))]
			if hs == nil || hs.place == nil {
				continue
			}
			h.mu.Lock()
			closing := h.closing
			h.mu.Unlock()
			if closing {
				continue
			}
			// A claim this host holds that goes (deleted by hand, say)
			// is no longer its: it stops at once, then claims again.
			hs.place.mu.Lock()
			if hs.place.claim != nil {
				h.stopServing(hs, "its placement claim was deleted or expired")
				hs.place.claim = nil
			}
			hs.place.mu.Unlock()
			cctx, cancel := context.WithTimeout(context.Background(), h.cfg.TTL/3)
			h.place(cctx, hs)
			if hs.place.holds() {
				if err := h.beat(cctx); err != nil {
					h.cfg.Logger.Warn("lattice heartbeat failed", "host", h.cfg.ID, "err", err)
				}
			}
			cancel()
		}
	}()
	return func() { _ = w.Stop(); <-done }, nil
}
