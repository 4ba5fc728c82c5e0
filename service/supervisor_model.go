package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/modelctl"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// ModelControl is model control that does not act on the server's own
// deployment: a supervisor's, which routes each request to its workers
// ([SupervisorModelControl]). [Server.SetModelControl] installs one; the
// admin routes (admin_http.go) then use it instead of the deployment.
type ModelControl interface {
	// Modules is the body of GET /v1/modules.
	Modules(ctx context.Context) (any, error)
	LoadModule(ctx context.Context, req deploy.ModuleRequest, bin []byte, source string) (deploy.ModuleInfo, bool, error)
	UnloadModule(ctx context.Context, ref string) ([]deploy.ModuleInfo, error)
	SwapSession(ctx context.Context, name, ref string) (deploy.SwapResult, error)
	ResetSession(ctx context.Context, name string) (deploy.ResetResult, error)
	// MaxModuleSize bounds an upload of module name.
	MaxModuleSize(name string) int64
}

type modelControlBox struct{ mc ModelControl }

// SetModelControl routes the admin routes' model control to mc (call it
// once, before or after [Server.Attach]).
func (s *Server) SetModelControl(mc ModelControl) { s.modelCtl.Store(&modelControlBox{mc}) }

func (s *Server) modelControl() ModelControl {
	if b := s.modelCtl.Load(); b != nil {
		return b.mc
	}
	return nil
}

// SupervisorModel is what [SupervisorModelControl] needs.
type SupervisorModel struct {
	// Conn is the supervisor's connection to the lattice, Lattice its
	// name.
	Conn    *nats.Conn
	Lattice string
	// Supervisor gives each worker's state and what it serves (a
	// *supervise.Supervisor); HostOf a worker's host id in the lattice.
	Supervisor interface {
		Status() []supervise.WorkerStatus
	}
	HostOf func(worker string) string
	// Store keeps the module bytes the workers load from and the model
	// state restored at their start.
	Store modelctl.Store
	// Manifest is the supervisor's.
	Manifest *manifest.Manifest
	Logger   *slog.Logger
}

// SupervisorModelControl routes model control to the ready workers of a
// supervisor, over the lattice (modelctl.Subject):
//
//   - a load or upload puts the module's bytes in the store, loads them
//     on every ready worker, and records the module in the store once
//     every one of them loaded it;
//   - an unload unloads on every ready worker, and drops the records of
//     the versions unloaded;
//   - a swap or reset goes to the ready workers that serve the session
//     (their ready report lists it); a swap is recorded once every one of
//     them swapped;
//   - GET /v1/modules lists the modules of every ready worker.
//
// A worker's refusal is answered with its class (the status a single
// process answers), its message prefixed by the worker's name; with no
// ready worker to ask, the answer is 503 unavailable.
//
// The second value is to be called with each worker's status change
// (supervise.Config.WithOnChange; it does not block): a worker that
// reports ready having restored an older revision of the model state
// than the store holds (an upload or swap came while it started) is
// asked to restore it again (modelctl.OpRestore), as is every ready
// worker after a change it was not asked to make.
func SupervisorModelControl(c SupervisorModel) (ModelControl, func(supervise.WorkerStatus)) {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	sm := &supervisorModel{c: c, caught: map[string]caughtUp{}}
	return sm, sm.workerChanged
}

type supervisorModel struct {
	c  SupervisorModel
	mu sync.Mutex
	// caught is, per worker, the process and the state's revision it is
	// known to have applied (its ready report, an operation it did, a
	// restore asked of it).
	caught map[string]caughtUp
}

type caughtUp struct {
	pid      int
	revision uint64
}

// workerChanged asks a worker that is ready with an older state than
// the store's to restore it again.
func (sm *supervisorModel) workerChanged(st supervise.WorkerStatus) {
	if st.State != supervise.StateReady || !st.Reported {
		return
	}
	go func() {
		state, err := sm.c.Store.Load(context.Background())
		if err != nil {
			sm.c.Logger.Warn("model state: cannot be read to check a ready worker's", "worker", st.Name, "err", err)
			return
		}
		sm.catchUp(st, state.Revision, false)
	}()
}

// catchUp makes sure the ready worker st has applied revision: it has if
// its ready report or an operation says so (done: it just did the
// operation that made revision); else it is asked to restore.
func (sm *supervisorModel) catchUp(st supervise.WorkerStatus, revision uint64, done bool) {
	sm.mu.Lock()
	c := sm.caught[st.Name]
	if c.pid != st.PID {
		c = caughtUp{pid: st.PID}
	}
	if done || st.StateRevision >= revision || c.revision >= revision {
		c.revision = max(c.revision, st.StateRevision)
		if done {
			c.revision = max(c.revision, revision)
		}
		sm.caught[st.Name] = c
		sm.mu.Unlock()
		return
	}
	c.revision = revision // asked now: not asked again for it
	sm.caught[st.Name] = c
	sm.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), modelctl.DefaultTimeout)
	defer cancel()
	rep, err := modelctl.Call(ctx, sm.c.Conn, sm.c.Lattice, sm.c.HostOf(st.Name), modelctl.Request{Op: modelctl.OpRestore})
	if err == nil {
		err = rep.Err()
	}
	if err != nil {
		sm.c.Logger.Warn("model state: a worker could not restore the state it missed while it started", "worker", st.Name, "revision", revision, "err", err)
		return
	}
	sm.c.Logger.Warn("model state: a worker restored the state again: it changed while the worker started", "worker", st.Name,
		"from_revision", st.StateRevision, "to_revision", rep.Restored.Revision, "applied", strings.Join(rep.Restored.Applied, "; "), "notes", strings.Join(rep.Restored.Notes, "; "))
}

// recorded is called after an operation on workers ws changed the
// store: ws have applied its new revision; every other ready worker
// (one that became ready while the operation ran) is asked to restore.
func (sm *supervisorModel) recorded(ctx context.Context, ws []supervise.WorkerStatus) {
	state, err := sm.c.Store.Load(ctx)
	if err != nil {
		sm.c.Logger.Warn("model state: cannot be read after an update", "err", err)
		return
	}
	did := map[string]int{}
	for _, w := range ws {
		did[w.Name] = w.PID
	}
	for _, st := range sm.c.Supervisor.Status() {
		if st.State != supervise.StateReady || !st.Reported {
			continue
		}
		if pid, ok := did[st.Name]; ok && pid == st.PID {
			sm.catchUp(st, state.Revision, true)
			continue
		}
		go sm.catchUp(st, state.Revision, false)
	}
}

// ready returns the ready workers; with session != "", those whose
// latest ready report lists it.
func (sm *supervisorModel) ready(session string) []supervise.WorkerStatus {
	var out []supervise.WorkerStatus
	for _, st := range sm.c.Supervisor.Status() {
		if st.State != supervise.StateReady {
			continue
		}
		if session != "" && !slices.Contains(st.Sessions, session) {
			continue
		}
		out = append(out, st)
	}
	return out
}

type workerReply struct {
	worker string
	rep    modelctl.Reply
}

// each sends req to every worker of ws, all at once, and returns the
// replies of those that did it, in ws's order; the first error in ws's
// order (a worker's refusal, or a worker that could not be reached) is
// returned with the worker's name in its message.
func (sm *supervisorModel) each(ctx context.Context, ws []supervise.WorkerStatus, req modelctl.Request) ([]workerReply, error) {
	reps := make([]modelctl.Reply, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[i], errs[i] = modelctl.Call(ctx, sm.c.Conn, sm.c.Lattice, sm.c.HostOf(w.Name), req)
			if errs[i] == nil {
				errs[i] = reps[i].Err()
			}
		}()
	}
	wg.Wait()
	var out []workerReply
	var first error
	for i, w := range ws {
		if err := errs[i]; err != nil {
			re := &errdefs.RemoteError{Class: deploy.Class(err), Message: "worker " + w.Name + ": " + err.Error(), Host: sm.c.HostOf(w.Name)}
			sm.c.Logger.Warn("model control: a worker refused", "worker", w.Name, "op", req.Op, "class", re.Class, "err", err)
			if first == nil {
				first = re
			}
			continue
		}
		out = append(out, workerReply{w.Name, reps[i]})
	}
	return out, first
}

func noWorker(what string) error {
	return &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "no worker is ready to " + what}
}

// ModulesBody is GET /v1/modules of a supervisor: the module versions
// of every ready worker, merged (Sessions: the union), and each worker's
// own list.
type ModulesBody struct {
	Modules []deploy.ModuleInfo            `json:"modules"`
	Workers map[string][]deploy.ModuleInfo `json:"workers"`
}

func (sm *supervisorModel) Modules(ctx context.Context) (any, error) {
	ws := sm.ready("")
	if len(ws) == 0 {
		return nil, noWorker("list its modules")
	}
	reps, err := sm.each(ctx, ws, modelctl.Request{Op: modelctl.OpModules})
	if err != nil {
		return nil, err
	}
	body := ModulesBody{Modules: []deploy.ModuleInfo{}, Workers: map[string][]deploy.ModuleInfo{}}
	at := map[string]int{}
	for _, r := range reps {
		body.Workers[r.worker] = r.rep.Modules
		for _, m := range r.rep.Modules {
			i, ok := at[m.Ref]
			if !ok {
				at[m.Ref] = len(body.Modules)
				m.Sessions = slices.Clone(m.Sessions)
				body.Modules = append(body.Modules, m)
				continue
			}
			for _, s := range m.Sessions {
				if !slices.Contains(body.Modules[i].Sessions, s) {
					body.Modules[i].Sessions = append(body.Modules[i].Sessions, s)
				}
			}
		}
	}
	slices.SortStableFunc(body.Modules, func(a, b deploy.ModuleInfo) int { return strings.Compare(a.Name, b.Name) })
	return body, nil
}

func (sm *supervisorModel) LoadModule(ctx context.Context, req deploy.ModuleRequest, bin []byte, source string) (deploy.ModuleInfo, bool, error) {
	req.SHA256 = strings.ToLower(req.SHA256)
	if req.SHA256 == "" {
		return deploy.ModuleInfo{}, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: no sha256 given", req.Name)
	}
	if size := sm.MaxModuleSize(req.Name); int64(len(bin)) > size {
		return deploy.ModuleInfo{}, false, errdefs.Errorf(errdefs.ErrOutOfBudget, "module %q: %d bytes, above the size limit of %d bytes", req.Name, len(bin), size)
	}
	ws := sm.ready("")
	if len(ws) == 0 {
		return deploy.ModuleInfo{}, false, noWorker("load the module")
	}
	if err := sm.c.Store.PutBlob(ctx, req.SHA256, bin); err != nil {
		return deploy.ModuleInfo{}, false, fmt.Errorf("module %q: %w", req.Name, err)
	}
	req.Path = ""
	reps, err := sm.each(ctx, ws, modelctl.Request{Op: modelctl.OpLoad, Module: &req, Source: source})
	if err != nil {
		return deploy.ModuleInfo{}, false, err
	}
	created := false
	for _, r := range reps {
		created = created || r.rep.Created
	}
	rec := modelctl.ModuleRecord{Name: req.Name, SHA256: req.SHA256, Kind: req.Kind, MemoryLimit: req.MemoryLimit, WASI: req.WASI,
		Snapshot: req.Snapshot, Source: source, At: time.Now().UTC()}
	if err := sm.c.Store.Update(ctx, func(st *modelctl.State) error { st.AddModule(rec); return nil }); err != nil {
		return deploy.ModuleInfo{}, false, fmt.Errorf("module %s@%s is loaded on every ready worker, but its record could not be saved (a restart loses it): %w", req.Name, req.SHA256, err)
	}
	sm.recorded(ctx, ws)
	return *reps[0].rep.Module, created, nil
}

func (sm *supervisorModel) UnloadModule(ctx context.Context, ref string) ([]deploy.ModuleInfo, error) {
	ws := sm.ready("")
	if len(ws) == 0 {
		return nil, noWorker("unload the module")
	}
	reps, err := sm.each(ctx, ws, modelctl.Request{Op: modelctl.OpUnload, Ref: ref})
	var gone []deploy.ModuleInfo
	seen := map[string]bool{}
	for _, r := range reps {
		for _, m := range r.rep.Unloaded {
			if !seen[m.Ref] {
				seen[m.Ref] = true
				gone = append(gone, m)
			}
		}
	}
	if len(gone) > 0 {
		if uerr := sm.c.Store.Update(ctx, func(st *modelctl.State) error {
			for _, m := range gone {
				st.RemoveModule(m.Name, m.SHA256)
			}
			return nil
		}); uerr != nil && err == nil {
			err = fmt.Errorf("unloaded from every ready worker, but the record could not be updated (a restart loads it again): %w", uerr)
		} else if uerr == nil && err == nil {
			sm.recorded(ctx, ws)
		}
	}
	if err != nil {
		return nil, err
	}
	return gone, nil
}

// served reports whether a worker's latest report, or the manifest while
// a worker has not reported yet, has session.
func (sm *supervisorModel) served(session string) bool {
	for _, st := range sm.c.Supervisor.Status() {
		if st.Reported && slices.Contains(st.Sessions, session) || !st.Reported && sm.c.Manifest.Session(session) != nil {
			return true
		}
	}
	return false
}

func (sm *supervisorModel) sessionTargets(session string) ([]supervise.WorkerStatus, error) {
	ws := sm.ready(session)
	if len(ws) > 0 {
		return ws, nil
	}
	if sm.served(session) {
		return nil, noWorker(fmt.Sprintf("serve session %q", session))
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", session)
}

func (sm *supervisorModel) SwapSession(ctx context.Context, name, ref string) (deploy.SwapResult, error) {
	ws, err := sm.sessionTargets(name)
	if err != nil {
		return deploy.SwapResult{}, err
	}
	// The ready workers that do not serve the session have nothing to do
	// for the swap; one that becomes ready meanwhile may serve it.
	all := sm.ready("")
	reps, err := sm.each(ctx, ws, modelctl.Request{Op: modelctl.OpSwap, Session: name, Stage: ref})
	if err != nil {
		return deploy.SwapResult{}, err
	}
	res := *reps[0].rep.Swap
	rec := modelctl.SwapRecord{Session: name, Stage: res.To, ManifestStage: reps[0].rep.ManifestStage, At: time.Now().UTC()}
	if err := sm.c.Store.Update(ctx, func(st *modelctl.State) error { st.SetSwap(rec); return nil }); err != nil {
		return deploy.SwapResult{}, fmt.Errorf("session %q is swapped to %s on every worker that serves it, but the swap could not be recorded (a restart undoes it): %w", name, res.To, err)
	}
	sm.recorded(ctx, all)
	sm.c.Logger.Info("session swapped on its workers", "session", name, "to", res.To, "workers", len(reps))
	return res, nil
}

func (sm *supervisorModel) ResetSession(ctx context.Context, name string) (deploy.ResetResult, error) {
	ws, err := sm.sessionTargets(name)
	if err != nil {
		return deploy.ResetResult{}, err
	}
	var res deploy.ResetResult
	var first error
	for _, w := range ws {
		rep, err := modelctl.Call(ctx, sm.c.Conn, sm.c.Lattice, sm.c.HostOf(w.Name), modelctl.Request{Op: modelctl.OpReset, Session: name})
		if err == nil {
			err = rep.Err()
		}
		if rep.Reset != nil {
			if res.Session == "" {
				res = *rep.Reset
			} else {
				res.Replaced = append(res.Replaced, rep.Reset.Replaced...)
				res.Skipped = append(res.Skipped, rep.Reset.Skipped...)
			}
		}
		if err != nil && first == nil {
			first = &errdefs.RemoteError{Class: deploy.Class(err), Message: "worker " + w.Name + ": " + err.Error(), Host: sm.c.HostOf(w.Name)}
		}
	}
	return res, first
}

func (sm *supervisorModel) MaxModuleSize(name string) int64 {
	limit := sm.c.Manifest.Runtime.MaxModuleSize
	if mm := sm.c.Manifest.Module(name); mm != nil && mm.MaxSize > limit {
		limit = mm.MaxSize
	}
	if limit <= 0 {
		limit = stages.DefaultMaxModuleSize
	}
	return limit
}

// LocalModelControl is model control of a single process's own
// deployment d that records uploads and swaps in store (serve
// --state-dir), as a supervisor does for its workers: a load or upload
// stores the bytes and records the module once d loaded it, an unload
// drops the records of the versions unloaded, a swap is recorded once
// done. modelctl.Restore applies the record when the process starts
// again.
func LocalModelControl(d *deploy.Deployment, store modelctl.Store, logger *slog.Logger) ModelControl {
	if logger == nil {
		logger = slog.Default()
	}
	return &localModel{d: d, store: store, log: logger}
}

type localModel struct {
	d     *deploy.Deployment
	store modelctl.Store
	log   *slog.Logger
}

func (lm *localModel) Modules(context.Context) (any, error) {
	return map[string]any{"modules": lm.d.Modules()}, nil
}

func (lm *localModel) MaxModuleSize(name string) int64 { return lm.d.MaxModuleSize(name) }

func (lm *localModel) LoadModule(ctx context.Context, req deploy.ModuleRequest, bin []byte, source string) (deploy.ModuleInfo, bool, error) {
	info, created, err := lm.d.LoadModule(ctx, req, bin, source)
	if err != nil {
		return info, created, err
	}
	if err := lm.store.PutBlob(ctx, info.SHA256, bin); err != nil {
		return info, created, fmt.Errorf("module %s is loaded, but its bytes could not be kept (a restart loses it): %w", info.Ref, err)
	}
	rec := modelctl.ModuleRecord{Name: req.Name, SHA256: info.SHA256, Kind: req.Kind, MemoryLimit: req.MemoryLimit, WASI: req.WASI,
		Snapshot: req.Snapshot, Source: source, At: time.Now().UTC()}
	if err := lm.store.Update(ctx, func(st *modelctl.State) error { st.AddModule(rec); return nil }); err != nil {
		return info, created, fmt.Errorf("module %s is loaded, but its record could not be saved (a restart loses it): %w", info.Ref, err)
	}
	return info, created, nil
}

func (lm *localModel) UnloadModule(ctx context.Context, ref string) ([]deploy.ModuleInfo, error) {
	gone, err := lm.d.UnloadModule(ctx, ref)
	if len(gone) > 0 {
		if uerr := lm.store.Update(ctx, func(st *modelctl.State) error {
			for _, m := range gone {
				st.RemoveModule(m.Name, m.SHA256)
			}
			return nil
		}); uerr != nil {
			lm.log.Error("model state: an unloaded module's record could not be dropped (a restart loads it again)", "module", ref, "err", uerr)
		}
	}
	return gone, err
}

func (lm *localModel) SwapSession(ctx context.Context, name, ref string) (deploy.SwapResult, error) {
	res, err := lm.d.SwapSession(ctx, name, ref)
	if err != nil {
		return res, err
	}
	rec := modelctl.SwapRecord{Session: name, Stage: res.To, ManifestStage: modelctl.ManifestStage(lm.d, name), At: time.Now().UTC()}
	if err := lm.store.Update(ctx, func(st *modelctl.State) error { st.SetSwap(rec); return nil }); err != nil {
		return res, fmt.Errorf("session %q is swapped to %s, but the swap could not be recorded (a restart undoes it): %w", name, res.To, err)
	}
	return res, nil
}

func (lm *localModel) ResetSession(ctx context.Context, name string) (deploy.ResetResult, error) {
	return lm.d.ResetSession(ctx, name)
}
