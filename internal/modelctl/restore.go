package modelctl

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/stagehost/stagehost/deploy"
)

// ManifestStage is session's stage module in d's manifest, name@sha256,
// or "" when the manifest has no such session or module.
func ManifestStage(d *deploy.Deployment, session string) string {
	ms := d.Manifest.Session(session)
	if ms == nil {
		return ""
	}
	mod := d.Manifest.Module(ms.Stage)
	if mod == nil {
		return ""
	}
	return mod.Name + "@" + mod.SHA256
}

// Restore applies st's state to d: it loads every recorded module
// version, then swaps each of d's sessions that has a swap record (a
// record of a session of another worker's device is skipped without a
// word). Each module and swap restored is logged ("restored swap of
// classify to name@sha256"); each that could not be is logged as a
// warning and returned as a note: a module whose bytes are missing or
// corrupt, or that no longer loads (its kind, limits or grants no longer
// fit); a swap of a session the manifest no longer has, whose stage the
// manifest changed since the swap, or that fails. Nothing is dropped
// from the store: the notes say what was not applied. Applied lists what
// was, one line each ("restored swap of classify to name@sha256"). It
// may run again on the same deployment: a module loaded already and a
// swap done already are applied again as no-ops.
func Restore(ctx context.Context, d *deploy.Deployment, st Store, log *slog.Logger) Restored {
	var r Restored
	r.Revision, r.Applied, r.Notes = restore(ctx, d, st, log)
	return r
}

// Restored is what [Restore] did.
type Restored struct {
	// Revision is the state's revision it applied.
	Revision uint64   `json:"revision"`
	Applied  []string `json:"applied,omitempty"`
	Notes    []string `json:"notes,omitempty"`
}

func restore(ctx context.Context, d *deploy.Deployment, st Store, log *slog.Logger) (revision uint64, applied, notes []string) {
	if log == nil {
		log = slog.Default()
	}
	note := func(msg string, args ...any) {
		n := fmt.Sprintf(msg, args...)
		log.Warn("model state: " + n)
		notes = append(notes, n)
	}
	state, err := st.Load(ctx)
	if err != nil {
		note("not restored: %v", err)
		return 0, nil, notes
	}
	for _, rec := range state.Modules {
		ref := rec.Name + "@" + rec.SHA256
		bin, err := st.Blob(ctx, rec.SHA256)
		if err != nil {
			note("module %s not restored: %v", ref, err)
			continue
		}
		source := rec.Source
		if source == "" {
			source = "upload"
		}
		if _, _, err := d.LoadModule(ctx, rec.Request(), bin, source); err != nil {
			note("module %s not restored: it no longer loads: %v", ref, err)
			continue
		}
		line := fmt.Sprintf("restored module %s", ref)
		log.Info(line, "module", rec.Name, "sha256", rec.SHA256)
		applied = append(applied, line)
	}
	for _, sw := range state.Swaps {
		if d.Manifest.Session(sw.Session) == nil {
			note("swap of %s to %s not restored: the manifest has no session %q", sw.Session, sw.Stage, sw.Session)
			continue
		}
		if d.Pool(sw.Session) == nil {
			continue // another worker's session
		}
		if cur := ManifestStage(d, sw.Session); sw.ManifestStage != "" && cur != sw.ManifestStage {
			note("swap of %s to %s not restored: the manifest's stage of %s is now %s, not %s as when it was swapped", sw.Session, sw.Stage, sw.Session, cur, sw.ManifestStage)
			continue
		}
		res, err := d.SwapSession(ctx, sw.Session, sw.Stage)
		if err != nil {
			note("swap of %s to %s not restored: %v", sw.Session, sw.Stage, err)
			continue
		}
		line := fmt.Sprintf("restored swap of %s to %s", sw.Session, res.To)
		log.Info(line, "session", sw.Session, "from", res.From, "to", res.To)
		applied = append(applied, line)
	}
	return state.Revision, applied, notes
}
