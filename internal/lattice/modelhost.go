package lattice

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// Model control on a host: the module each session runs follows the
// lattice's desired module (models.go), or a per-host swap (Host.Swap).
// docs/lattice.md, "Model control in a lattice".

// modelState is what a host knows of one session's module (under mu).
type modelState struct {
	mu sync.Mutex
	// applied is the revision of the lattice's desired module the session
	// runs (0: none applied); failed the revision whose apply failed, and
	// why.
	applied, failed uint64
	why             string
	failedAt        time.Time
	// hostOnly: a per-host swap since the desired revision pinned, which
	// the host runs until the lattice's next swap.
	hostOnly bool
	pinned   uint64
}

// modelRetry is how long after a failed apply a host tries the same
// revision again (the module store may have been unreachable, a device
// lost for a moment). A variable for the tests.
var modelRetry atomic.Int64 // nanoseconds

func init() { modelRetry.Store(int64(10 * time.Second)) }

// drainPoll is how often a host checks whether the calls on a session's
// replaced instances have ended, before it acknowledges a swap.
const drainPoll = time.Millisecond

// applyTimeout bounds a host's apply of one desired module: reading its
// bytes, loading it, making the new instances and the drain of the old
// ones.
const applyTimeout = 5 * time.Minute

// running is the sha256 of the stage module the session's instances run
// now: after a swap, the new module's (the manifest's when the session
// was never created).
func (hs *hostSession) running() string {
	if s := hs.sess.StageSHA256(); s != "" {
		return s
	}
	return hs.stage
}

// unapplied says why the host must not run the session's calls: a swap
// of the lattice was committed (every live host acknowledged it) and
// this host has not applied it, so it runs a module that no other host
// runs any more; "" when it may. A swap this host failed to apply, not
// committed, leaves it serving its module (the swap's answer says so).
func (h *Host) unapplied(hs *hostSession) string {
	m := &hs.model
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := h.models.committed(hs.name); m.behind(c) {
		return fmt.Sprintf("it has not applied revision %d of the lattice's module for it yet (the swap was committed without this host)", c)
	}
	return ""
}

// behind says whether the session runs an older module than revision rev
// of the lattice's desired one: it has applied an older revision, and no
// host-only swap since rev. m.mu held.
func (m *modelState) behind(rev uint64) bool {
	return rev > m.applied && !(m.hostOnly && m.pinned >= rev)
}

// behindCall says whether the host must not run a call whose front knows
// revision rev (ModelRevisionHeader) as committed for the session.
func (h *Host) behindCall(hs *hostSession, rev uint64) bool {
	if rev == 0 {
		return false
	}
	m := &hs.model
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.behind(rev)
}

// runnable checks the module the turn's instance runs against the shared
// quarantine, just before the call starts: whatever the manifest says,
// and whatever swap happened since the session was checked.
func (h *Host) runnable(hs *hostSession, turn *deploy.Turn) error {
	if p, ok := h.q.Lookup(turn.StageSHA256()); ok {
		return refusal(h.cfg.ID, p)
	}
	if hs.fence != "" {
		if p, ok := h.q.Lookup(hs.fence); ok {
			return refusal(h.cfg.ID, p)
		}
	}
	return nil
}

// applyDesired makes hs run the lattice's desired module, if the lattice
// has one for it that this host has not applied (nor failed to apply):
// it loads the module (from the modules store when this host does not
// have it), swaps the session's instances to it, waits until the calls
// on the old instances have ended, and records the revision as applied,
// which the next heartbeat acknowledges. It reports whether anything
// changed.
func (h *Host) applyDesired(ctx context.Context, hs *hostSession) bool {
	h.swapMu.Lock()
	defer h.swapMu.Unlock()
	dm, ok := h.models.lookup(hs.name)
	if !ok {
		return false
	}
	m := &hs.model
	m.mu.Lock()
	if m.applied >= dm.Revision || (m.failed == dm.Revision && time.Since(m.failedAt) < time.Duration(modelRetry.Load())) || (m.hostOnly && dm.Revision <= m.pinned) {
		m.mu.Unlock()
		return false
	}
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	err := h.apply(ctx, hs, dm)
	m.mu.Lock()
	if err != nil {
		m.failed, m.why, m.failedAt = dm.Revision, publicLine(err.Error()), time.Now()
	} else {
		m.applied, m.failed, m.why, m.hostOnly = dm.Revision, 0, "", false
	}
	m.mu.Unlock()
	if err != nil {
		h.cfg.Logger.Error("lattice: applying the lattice's module for a session failed; the session is refused on this host", "host", h.cfg.ID,
			"session", hs.name, "module", dm.Module, "sha256", dm.SHA256, "revision", dm.Revision, "err", err)
	} else {
		h.cfg.Logger.Info("lattice: session runs the lattice's module", "host", h.cfg.ID, "session", hs.name, "module", dm.Module, "sha256", dm.SHA256, "revision", dm.Revision)
	}
	return true
}

func (h *Host) apply(ctx context.Context, hs *hostSession, dm DesiredModule) error {
	if hold := h.applyHold.Load(); hold != nil {
		(*hold)()
	}
	if p, ok := h.q.Lookup(dm.SHA256); ok {
		return fmt.Errorf("module %s is quarantined lattice-wide: %s", dm.SHA256, p.Reason)
	}
	if hs.running() != dm.SHA256 || hs.sess.Failed() != nil {
		if !h.hasModule(dm.Module, dm.SHA256) {
			bin, err := h.models.fetch(ctx, dm.SHA256)
			if err != nil {
				return err
			}
			req := deploy.ModuleRequest{Name: dm.Module, SHA256: dm.SHA256, Kind: "stage", WASI: dm.WASI, Snapshot: &dm.Snapshot}
			if dm.MemoryLimit > 0 {
				req.MemoryLimit = &dm.MemoryLimit
			}
			if _, _, err := h.d.LoadModule(ctx, req, bin, "lattice"); err != nil {
				return err
			}
		}
		if _, err := h.d.SwapSession(ctx, hs.name, dm.Module+"@"+dm.SHA256); err != nil {
			return err
		}
	}
	return h.drained(ctx, hs)
}

// drained waits until no call runs on a replaced instance of hs.
func (h *Host) drained(ctx context.Context, hs *hostSession) error {
	if hs.sess.Draining() == 0 {
		return nil
	}
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for hs.sess.Draining() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the calls on the replaced instances did not end: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// hasModule says whether the deployment has loaded version sha of module
// name.
func (h *Host) hasModule(name, sha string) bool {
	for _, mi := range h.d.Modules() {
		if mi.Name == name && mi.SHA256 == sha {
			return true
		}
	}
	return false
}

// watchModels applies each new desired module as the models bucket
// changes, and heartbeats at once after each, until the host leaves.
func (h *Host) watchModels() {
	defer close(h.modelsDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-h.stop
		cancel()
	}()
	retry := time.NewTicker(time.Duration(modelRetry.Load()))
	defer retry.Stop()
	for {
		changed := h.models.changed.wait()
		beat := false
		for _, name := range h.names {
			hs := h.sessions[name]
			if h.applyDesired(ctx, hs) {
				beat = true
			}
			// A commit this host missed takes it out of the session's
			// queue group until it has applied it.
			if h.updateEndpoint(hs) {
				beat = true
			}
		}
		if beat {
			h.beatNow()
		}
		select {
		case <-h.stop:
			return
		case <-changed:
		case <-retry.C: // failed applies are tried again
		}
	}
}

// settled publishes what a swap changed: the session's endpoint joins or
// leaves its queue group as it can serve now, and the heartbeat goes out
// at once (not at the next tick).
func (h *Host) settled(hs *hostSession) {
	h.updateEndpoint(hs)
	h.beatNow()
}

// Swap swaps one session of this host only to module ref ("name": its
// newest loaded version; "name@SHA256"), as deploy.Deployment.SwapSession
// does, and heartbeats at once: the session's stage_sha256 is the new
// module's and host_only is true. The host runs it until the lattice's
// next lattice-wide swap of the session, which it applies.
//
// # Errors
//
// [errdefs.ErrNotFound] for a session the host does not have or an
// unknown module; [errdefs.ErrInvalidArgument] for a module in the
// shared quarantine (read from its bucket; nothing is swapped) and as
// SwapSession; an [*Error] of class unavailable when the quarantine
// bucket cannot be read.
func (h *Host) Swap(ctx context.Context, session, ref string) (deploy.SwapResult, error) {
	hs := h.sessions[session]
	if hs == nil {
		return deploy.SwapResult{}, errdefs.Errorf(errdefs.ErrNotFound, "no session %q on host %s", session, h.cfg.ID)
	}
	info, _, err := h.d.ModuleBytes(ref)
	if err != nil {
		return deploy.SwapResult{}, err
	}
	if p, ok, err := h.q.Get(ctx, info.SHA256); err != nil {
		return deploy.SwapResult{}, unavailable(h.cfg.ID, "swap of session %q: %v", session, err)
	} else if ok {
		return deploy.SwapResult{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %s is quarantined lattice-wide (%s): clear it first (DELETE /v1/lattice/quarantine/%s)", info.Ref, p.Reason, info.SHA256)
	}
	h.swapMu.Lock()
	defer h.swapMu.Unlock()
	res, err := h.d.SwapSession(ctx, session, info.Ref)
	if err != nil {
		return res, err
	}
	m := &hs.model
	m.mu.Lock()
	m.hostOnly = true
	m.pinned = 0
	if dm, ok := h.models.lookup(session); ok {
		m.pinned = dm.Revision
	}
	m.mu.Unlock()
	h.settled(hs)
	return res, nil
}

// modelFields fills a heartbeat's session with its model state.
func (h *Host) modelFields(hs *hostSession, sc *SessionCapacity) {
	m := &hs.model
	m.mu.Lock()
	sc.ModelRevision, sc.HostOnly = m.applied, m.hostOnly
	if m.failed != 0 && m.failed > m.applied {
		sc.ModelFailed, sc.ModelError = m.failed, m.why
	}
	m.mu.Unlock()
	if why := h.unapplied(hs); why != "" && sc.State == "ready" {
		sc.State, sc.Reason = "refused", why
	}
}

// refusedSwap is the error of a swap to a module in the shared
// quarantine.
func refusedSwap(ref string, p Poison) *Error {
	return &Error{Class: errdefs.ClassInvalidArgument,
		Message: fmt.Sprintf("module %s is quarantined lattice-wide (%s): clear it first (DELETE /v1/lattice/quarantine/%s)", ref, strings.TrimSpace(p.Reason), p.SHA256)}
}
