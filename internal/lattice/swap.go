package lattice

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// DefaultSwapTimeout bounds a lattice-wide swap whose context has no
// deadline: how long the front waits for every live host that has the
// session to acknowledge it.
const DefaultSwapTimeout = time.Minute

// SwapAnswer is the answer of a swap through the lattice: lattice-wide
// ([Front.SwapSession]) or of one host ([Member.SwapSession] with
// hostOnly).
type SwapAnswer struct {
	Session string `json:"session"`
	// To is the module, name@sha256; SHA256 its sha256.
	To     string `json:"to"`
	SHA256 string `json:"sha256"`
	// HostOnly: the swap of this host only; Local is then its result.
	HostOnly bool               `json:"host_only"`
	Local    *deploy.SwapResult `json:"local,omitempty"`
	// Revision is the lattice-wide swap's revision in the models bucket.
	Revision uint64 `json:"revision,omitempty"`
	// Hosts are the live hosts that had the session, each with what its
	// heartbeat said when the swap answered.
	Hosts []SwapHost `json:"hosts"`
	// TookMS is how long the lattice-wide swap took, in milliseconds.
	TookMS float64 `json:"took_ms"`
}

// SwapHost is one host's part in a lattice-wide swap.
type SwapHost struct {
	ID string `json:"id"`
	// Acknowledged: its heartbeat says it runs the swap's module
	// (StageSHA256) at the swap's revision or a later one.
	Acknowledged bool   `json:"acknowledged"`
	StageSHA256  string `json:"stage_sha256"`
	Revision     uint64 `json:"model_revision"`
	// Error is why its apply failed (it refuses the session's calls).
	Error string `json:"error,omitempty"`
}

// SwapSession swaps session to module dm (dm.Module, dm.SHA256, with
// bin its bytes) on every host of the lattice: it stores bin in the
// modules store, under its sha256, and dm as the session's desired
// module in the models bucket (a new revision), then waits until every
// live host whose heartbeat has the session acknowledges the revision in
// its heartbeat (a host acknowledges once its instances run the module
// and the calls on its old instances have ended). So once it returns nil,
// no call runs the old module on any live host: a call that starts later
// runs the new one. A host that joins or restarts later applies the
// desired module before it serves the session.
//
// On an error after the record was written, the record stays (nothing is
// rolled back) and the swap is not committed: the hosts that have not
// applied it keep serving their module and apply it when they can (a
// failed apply is tried again every 10 s). The answer then lists each
// host and what it said.
//
// # Errors
//
//   - invalid_argument: a bad session name, bin whose sha256 is not
//     dm.SHA256, or a module in the shared quarantine (read from its
//     bucket, not this front's view; nothing is written);
//   - not_found: no heartbeat named the session since the front started;
//   - unavailable: the quarantine bucket could not be read, the modules
//     store or the models bucket could not be written, or an apply
//     failed on every host that did not acknowledge (each named, with
//     its error; those hosts keep serving their module);
//   - deadline_exceeded: ctx's deadline (or [DefaultSwapTimeout]) passed
//     before every host acknowledged; the hosts that did not are named.
func (f *Front) SwapSession(ctx context.Context, dm DesiredModule, bin []byte) (SwapAnswer, error) {
	start := time.Now()
	ans := SwapAnswer{Session: dm.Session, To: dm.Module + "@" + dm.SHA256, SHA256: dm.SHA256, Hosts: []SwapHost{}}
	if err := checkName("session", dm.Session); err != nil {
		return ans, &Error{Class: errdefs.ClassInvalidArgument, Message: err.Error()}
	}
	if got := stages.SHA256(bin); got != dm.SHA256 {
		return ans, &Error{Class: errdefs.ClassInvalidArgument, Message: fmt.Sprintf("module %s: its bytes hash to %s, not %s", dm.Module, got, dm.SHA256)}
	}
	if p, ok, err := f.q.Get(ctx, dm.SHA256); err != nil {
		return ans, unavailable("", "swap of session %q: %v", dm.Session, err)
	} else if ok {
		return ans, refusedSwap(ans.To, p)
	}
	if !f.Known(dm.Session) {
		return ans, &Error{Class: errdefs.ClassNotFound, Message: fmt.Sprintf("no host of lattice %s has session %q", f.cfg.Lattice, dm.Session)}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultSwapTimeout)
		defer cancel()
	}
	m := f.models
	if dm.At.IsZero() {
		dm.At = time.Now().UTC()
	}
	rev, err := m.publish(ctx, dm, bin)
	if err != nil {
		return ans, unavailable("", "swap of session %q to %s: %v", dm.Session, ans.To, err)
	}
	ans.Revision = rev
	f.cfg.Logger.Info("lattice: swapping a session lattice-wide", "session", dm.Session, "to", ans.To, "revision", rev)
	var pending, failed []string
	check := func() bool {
		ans.Hosts, pending, failed = f.swapState(dm.Session, dm.SHA256, rev)
		return len(pending) == len(failed) // none still applying: each acknowledged or failed
	}
	// The state the last check saw: the one that held, or the last one
	// before the deadline.
	werr := f.WaitFor(ctx, check)
	ans.TookMS = float64(time.Since(start).Microseconds()) / 1000
	switch {
	case werr == nil && len(failed) > 0:
		return ans, unavailable("", "swap of session %q to %s (revision %d): applying it failed on %s; those hosts keep serving their module and try again every %v; the swap is not committed",
			dm.Session, ans.To, rev, strings.Join(failed, "; "), time.Duration(modelRetry.Load()))
	case werr != nil:
		return ans, &Error{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("swap of session %q to %s (revision %d): not acknowledged within the deadline by %s; the swap is not committed: those hosts keep serving their module until they apply it",
			dm.Session, ans.To, rev, strings.Join(pending, ", "))}
	}
	// Committed: a host that missed the swap (it was away) refuses the
	// session's calls until it has applied it, and so do the calls of
	// every front that knows the commit.
	if err := m.commit(ctx, dm.Session, dm.SHA256, rev); err != nil {
		return ans, unavailable("", "swap of session %q to %s (revision %d): every host acknowledged it, but committing it failed: %v", dm.Session, ans.To, rev, err)
	}
	f.cfg.Logger.Info("lattice: session swapped lattice-wide", "session", dm.Session, "to", ans.To, "revision", rev, "hosts", len(ans.Hosts), "took_ms", ans.TookMS)
	return ans, nil
}

// swapState lists the live hosts that have session, and those that have
// not acknowledged revision rev of module sha (pending: each with why,
// failed ones included) and those whose apply failed.
func (f *Front) swapState(session, sha string, rev uint64) (hosts []SwapHost, pending, failed []string) {
	hosts = []SwapHost{}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, lh := range f.hosts {
		for _, sc := range lh.rec.Sessions {
			if sc.Name != session {
				continue
			}
			sh := SwapHost{ID: id, StageSHA256: sc.StageSHA256, Revision: sc.ModelRevision}
			sh.Acknowledged = sc.ModelRevision > rev || (sc.ModelRevision == rev && sc.StageSHA256 == sha)
			if !sh.Acknowledged && sc.ModelFailed >= rev {
				sh.Error = sc.ModelError
				failed = append(failed, fmt.Sprintf("host %s: %s", id, sc.ModelError))
			}
			if !sh.Acknowledged {
				if sh.Error != "" {
					pending = append(pending, fmt.Sprintf("host %s (its apply failed: %s)", id, sh.Error))
				} else {
					pending = append(pending, "host "+id)
				}
			}
			hosts = append(hosts, sh)
		}
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].ID < hosts[j].ID })
	sort.Strings(pending)
	sort.Strings(failed)
	return hosts, pending, failed
}
