// Package deploy builds a running [Deployment] from a validated manifest:
// the runtime, devices on their backends, compiled modules, a [Pool] of
// stage-session instances per declared session and a [Resident] per
// declared resident session, and runs them. The CLI and the HTTP service
// are thin layers over a [Deployment].
package deploy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// Config tunes how a deployment starts. It is immutable: every WithX
// method returns a modified copy, so a Config can be shared and reused. A
// zero Config is [NewConfig]'s defaults.
//
//	d, err := deploy.Open(ctx, m, deploy.NewConfig().WithOnly("fill"))
type Config struct {
	logger   *slog.Logger
	progress func(msg string)
	only     string
	device   string
	// tenant, when byTenant: the one tenant whose sessions it runs
	// ("" for those without a tenant).
	tenant   string
	byTenant bool
	// overdueGrace and overdue: Config.WithOverdue.
	overdueGrace time.Duration
	overdue      func(Overdue)
}

// NewConfig returns the default configuration:
//
//   - logger slog.Default() (see [Config.WithLogger]);
//   - no progress lines (see [Config.WithProgress]);
//   - every session and resident session (see [Config.WithOnly]);
//   - every device (see [Config.WithDevice]);
//   - every tenant's sessions (see [Config.WithTenant]);
//   - no watch on overdue calls (see [Config.WithOverdue]).
func NewConfig() Config { return Config{} }

// WithLogger sends host and guest logs to logger. Default slog.Default();
// nil means the default.
func (c Config) WithLogger(logger *slog.Logger) Config {
	c.logger = logger
	return c
}

// WithProgress tells fn about slow start-up steps (module compilation,
// the upload of weights above 64 MiB, a line per tenth), one line each.
// Default: none.
func (c Config) WithProgress(fn func(msg string)) Config {
	c.progress = fn
	return c
}

// WithOnly names the one session or resident session to open: only the
// modules it needs are loaded, and the deployment has no other session or
// resident session. Devices are all opened. Default "": every one.
func (c Config) WithOnly(name string) Config {
	c.only = name
	return c
}

// WithDevice names the one device whose work the deployment runs (a
// `serve --supervise` worker): it opens that device only, plus the npu
// device of each resident session whose gpu it is; the sessions with an
// instance slot on it, each with only the instances that fall on it (a
// pooled session over several devices has its other instances in other
// workers); and the resident sessions whose gpu it is. Only the modules
// those sessions need are loaded. Default "": every device. A name the
// manifest does not declare makes [Open] fail with [errdefs.ErrNotFound].
func (c Config) WithDevice(name string) Config {
	c.device = name
	return c
}

// WithTenant narrows the deployment to the sessions of one tenant
// ([manifest.Session.TenantName]), a `serve --supervise` worker of a
// tenant: with name "" only the sessions without a tenant, and the
// resident sessions; with a tenant's name only that tenant's sessions,
// and no resident session. Default (not called): every session. A
// worker of a tenant is a failure domain of its own (docs/security.md).
func (c Config) WithTenant(name string) Config {
	c.tenant, c.byTenant = name, true
	return c
}

// Overdue describes a call that had not ended grace after its deadline
// ([Config.WithOverdue]): its stage was interrupted at the deadline, so
// what still runs is its fence, waiting on device work that has not
// finished (a hung kernel).
type Overdue struct {
	Session  string
	Instance int
	Device   string
	// Deadline is the session's deadline counted from when the call had
	// its instance. A caller's earlier deadline (its context's, such as
	// a Stagehost-Deadline header's) is not used: it ends the caller's
	// wait, and interrupts the stage, but the tenant's device work is
	// allowed the session's deadline, so a caller cannot make healthy
	// work look hung.
	Deadline time.Time
	// Grace is the grace the call outlived past Deadline.
	Grace time.Duration
}

// WithOverdue makes the deployment call fn, on a goroutine of its own,
// for every call still running grace after its session's deadline
// (counted from when the call had its instance, whatever earlier
// deadline the caller gave): the call's stage was interrupted by then
// (ABI.md §4.2), so what still runs is the fence, waiting on device work
// that has not finished. Nothing
// inside the process can stop such work on a GPU (docs/security.md): a
// tenant's worker of `serve --supervise` ends itself from fn. fn runs at
// most once per call; the call itself goes on (its fence still ends at
// fence_timeout, quarantining the instance). Default: no watch (grace
// <= 0 or fn nil).
func (c Config) WithOverdue(grace time.Duration, fn func(Overdue)) Config {
	c.overdueGrace, c.overdue = grace, fn
	return c
}

// Deployment is a running manifest.
type Deployment struct {
	Manifest *manifest.Manifest
	Runtime  *host.Runtime
	Engine   *stages.Engine

	logger  *slog.Logger
	simP    *sim.Platform
	cudaP   *cuda.Platform
	devices map[string]hw.Device
	modules map[string]*stages.Module
	kernels map[string]*stages.WasmKernel // vendor Wasm kernels, by name (kernels.go)
	vendor  vendorCache                   // vendor PTX kernels' bytes, cubins and programs (kernels.go)

	sessions  map[string]*Pool
	residents map[string]*Resident

	device string // Config.WithDevice: "" for every device
	// tenant, when byTenant: Config.WithTenant's tenant.
	tenant   string
	byTenant bool
	// overdueGrace and overdue: Config.WithOverdue (overdue nil: none).
	overdueGrace time.Duration
	overdue      func(Overdue)

	admin adminState // model control (admin.go)

	weights  weightsState     // device copies of weights and device budgets (weights.go)
	progress func(msg string) // Config.WithProgress, or nil
}

// Pool serves one named manifest session: a pool of one or more
// instances ([manifest.Session.Instances]), each a [stages.Session] on one
// of the session's devices. Four types carry the word "session", one per
// concept:
//
//   - [manifest.Session] is the declaration, a [[session]] table;
//   - a Pool is that declaration served: the instances, the queue of calls
//     waiting for one, the counts and the model control;
//   - a [stages.Session] is one instance: one Wasm module instance with its
//     own owner, streams and budget, running one call at a time (inside a
//     [stages.NativeSession], the wrapper that runs Go code on an owner's
//     device state under the host's fence);
//   - a [Resident] serves a [[resident]] table: a
//     [sessions.ResidentSession], a GPU–NPU pair of resident programs.
//
// A call takes a free instance, preferring one whose device's compute lane
// is free, or waits for one in arrival order, within the session's
// queue_limit and queue_timeout.
//
// A pool whose session could not be created at start-up has failed: it has
// no instances, [Pool.Failed] says why, and every call returns an error
// that wraps [ErrUnavailable].
//
// Its instances can be swapped to another version of the stage module,
// and its out-of-service instances replaced (admin.go): an instance
// replaced while a call runs on it finishes that call first (the drain);
// a quarantined one is never closed, and is listed as retired.
type Pool struct {
	Spec *manifest.Session
	d    *Deployment

	mu      sync.Mutex
	pool    *pool[*instance] // nil while failed; once set, never replaced (its members are)
	failed  error            // why the session could not be created
	stage   *stages.Module   // the stage module of the current instances
	fence   *stages.Module   // the fence module, or nil
	retired []*retiredInstance
	gen     int // instance generations made, for owner names (under the deployment's admin lock)
	calls   uint64
	fails   uint64
	// outcomes counts calls by outcome (Outcome's class names): the
	// counts of /v1/sessions and stagehost_session_runs_total alike.
	outcomes map[string]uint64
}

// ErrUnavailable is wrapped by the error of every call to a session that
// could not be created. The HTTP service answers it with 503.
var ErrUnavailable = errors.New("session unavailable")

// unavailableError is the error of a call to a failed session.
type unavailableError struct {
	name   string
	reason error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("session %q is unavailable: it could not be created: %v", e.name, e.reason)
}

func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.reason} }

// Open builds the deployment, configured by opt (a zero Config is
// [NewConfig]'s defaults). Nothing runs until Run or RunResident.
//
// A session whose creation fails (its module traps or runs past the init
// timeout in stagehost_init, say) does not stop the others: it is
// recorded as failed, with the error as its reason (see
// [Pool.Failed] and [Deployment.FailedSessions]), and logged.
//
// # Errors
//
// [errdefs.ErrUnsupported] when a cuda device is declared but no CUDA driver is
// present, or a session on a cuda GPU lists a vendor PTX kernel (it runs
// only in a worker process of its tenant: serve --supervise); [errdefs.ErrNotFound] for a [Config.WithDevice] device the
// manifest does not declare; device errors; module load errors; the error of a session's
// creation when ctx ends during it.
func Open(ctx context.Context, m *manifest.Manifest, opt Config) (*Deployment, error) {
	if opt.logger == nil {
		opt.logger = slog.Default()
	}
	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(m.Runtime.Capacity).WithTraceCapacity(m.Runtime.TraceBuffer))
	if err != nil {
		return nil, err
	}
	d := &Deployment{Manifest: m, Runtime: rt, logger: opt.logger,
		devices: map[string]hw.Device{}, modules: map[string]*stages.Module{},
		sessions: map[string]*Pool{}, residents: map[string]*Resident{}, device: opt.device, progress: opt.progress,
		tenant: opt.tenant, byTenant: opt.byTenant}
	if opt.overdueGrace > 0 && opt.overdue != nil {
		d.overdueGrace, d.overdue = opt.overdueGrace, opt.overdue
	}
	if opt.device != "" && m.Device(opt.device) == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no device %q in the manifest", opt.device)
	}
	if err := refuseVendorPTX(m, opt.device, opt.tenant, opt.byTenant); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = d.Close(context.Background())
		}
	}()
	if err := d.openDevices(); err != nil {
		return nil, err
	}
	cacheDir, err := d.openEngine(ctx, opt.logger)
	if err != nil {
		return nil, err
	}
	if err := d.loadModules(ctx, opt, cacheDir); err != nil {
		return nil, err
	}
	if err := d.loadKernels(ctx); err != nil {
		return nil, err
	}
	releaseWeights, err := d.loadWeights(ctx, opt)
	if err != nil {
		return nil, err
	}
	err = d.openSessions(ctx, opt)
	releaseWeights() // the sessions hold theirs: weights no session holds are freed
	if err != nil {
		return nil, err
	}
	d.addResidents(opt)
	if err := d.injectFaults(); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// cacheDirOf is the directory of m's compilation file cache ("" when it
// is off): cache_dir, resolved against the manifest's directory, or the
// default one.
func cacheDirOf(m *manifest.Manifest) string { return CacheDir(m) }

// CacheDir is the directory of m's compilation caches, Wasm modules and
// vendor kernels' cubins ("" when cache_dir is "off"): cache_dir,
// resolved against the manifest's directory, or the default one.
func CacheDir(m *manifest.Manifest) string {
	switch dir := m.Runtime.CacheDir; {
	case dir == manifest.CacheOff:
		return ""
	case dir == "":
		return stages.DefaultCacheDir()
	case filepath.IsAbs(dir):
		return dir
	default:
		return filepath.Join(m.Dir, dir)
	}
}

// openEngine makes d's Wasm engine with the manifest's file cache, or
// without one (with a warning) when the cache directory, cache_dir or
// the default, cannot be opened: a cache never stops the host. It
// returns the cache directory the engine uses ("" for none). A cache
// that opens but cannot be written is the engine's to work around
// (stages.Engine compiles without it).
func (d *Deployment) openEngine(ctx context.Context, logger *slog.Logger) (string, error) {
	m := d.Manifest
	cacheDir := cacheDirOf(m)
	var err error
	ecfg := stages.NewEngineConfig().WithLogger(logger).WithMaxModuleSize(m.Runtime.MaxModuleSize).WithCacheDir(cacheDir)
	if d.Engine, err = stages.NewEngine(ctx, ecfg); err != nil {
		if cacheDir == "" || !errors.Is(err, errdefs.ErrUnsupported) {
			return "", err
		}
		// A cache is a convenience: without it every start compiles
		// again, but nothing else changes.
		logger.Warn("compilation cache unavailable, compiling without it", "cache_dir", cacheDir, "err", err)
		if d.Engine, err = stages.NewEngine(ctx, ecfg.WithCacheDir("")); err != nil {
			return "", err
		}
		cacheDir = ""
	}
	return cacheDir, nil
}

// loadModules loads the modules d needs (opt.only's, opt.device's, or
// all), reporting each to opt.progress.
func (d *Deployment) loadModules(ctx context.Context, opt Config, cacheDir string) error {
	m := d.Manifest
	needed := neededModules(m, opt.only)
	if opt.device != "" || opt.byTenant {
		needed = d.deviceModules(needed)
	}
	for i := range m.Modules {
		mm := &m.Modules[i]
		if needed != nil && !needed[mm.Name] {
			continue
		}
		if err := d.loadModule(ctx, mm, opt.progress, cacheDir); err != nil {
			return err
		}
	}
	return nil
}

// loadModule loads one module, and tells progress (when not nil) whether
// it was compiled or read from the file cache.
func (d *Deployment) loadModule(ctx context.Context, mm *manifest.Module, progress func(string), cacheDir string) error {
	if progress != nil {
		progress(fmt.Sprintf("loading module %s (%d KiB)", mm.Name, len(mm.Bytes)>>10))
	}
	// stages' compile-progress callback cannot tell a file-cache hit
	// (its cached argument is always false: wazero consults the file
	// cache inside CompileModule), and timing would guess. wazero's
	// file cache writes one file per compiled module and never
	// rewrites one it read, so the load compiled if the cache
	// directory gained an entry, and was a hit if it did not. (Another
	// process filling the same directory at the same moment can make
	// a hit read as a compilation; never the other way round.)
	before := cacheEntries(cacheDir)
	start := time.Now()
	mod, err := d.Engine.Load(ctx, mm.Bytes, mm.SHA256, mm.LoadConfig())
	if err != nil {
		return err
	}
	if progress != nil {
		took := time.Since(start).Round(time.Millisecond)
		switch {
		case cacheDir == "":
			progress(fmt.Sprintf("module %s compiled in %v (the compilation cache is off)", mm.Name, took))
		case cacheEntries(cacheDir) > before:
			progress(fmt.Sprintf("module %s compiled in %v (cached for the next start)", mm.Name, took))
		default:
			progress(fmt.Sprintf("module %s read from the compilation cache in %v", mm.Name, took))
		}
	}
	d.modules[mm.Name] = mod
	d.registerModule(mm, mod)
	return nil
}

// openSessions creates d's sessions (opt.only's, opt.device's, or all).
// A session that cannot be created is recorded as failed, and the others
// are created; only the end of ctx stops it.
func (d *Deployment) openSessions(ctx context.Context, opt Config) error {
	m := d.Manifest
	for i := range m.Sessions {
		ms := &m.Sessions[i]
		if opt.only != "" && ms.Name != opt.only || !d.onDevice(ms) {
			continue
		}
		s := d.newSession(ms)
		if mm := m.Module(ms.Stage); s.stage != nil && mm != nil {
			// The stage module's declared requirements (abi/ABI.md §7):
			// a module the session cannot serve stops the start-up,
			// as a manifest error would, rather than fail in a call.
			if err := s.stage.Requires().Check(ms.Stage, ms.Offer(mm.WASI)); err != nil {
				return fmt.Errorf("session %q: %w", ms.Name, err)
			}
		}
		if err := s.open(ctx); err != nil {
			if ctx.Err() != nil {
				return err // start-up was cancelled: no session is to blame
			}
			opt.logger.Error("session could not be created; the others run", "session", ms.Name, "err", err)
			s.failed = err
		}
		d.sessions[ms.Name] = s
	}
	return nil
}

// addResidents adds d's resident sessions (opt.only's, opt.device's, or
// all); they start with RunResident.
func (d *Deployment) addResidents(opt Config) {
	m := d.Manifest
	for i := range m.Residents {
		r := &m.Residents[i]
		if opt.only != "" && r.Name != opt.only || opt.device != "" && r.GPU != opt.device || opt.byTenant && opt.tenant != "" {
			continue
		}
		d.residents[r.Name] = &Resident{Spec: r, d: d, epoch: rand.Text()}
	}
}

// neededModules returns the modules that session or resident only needs
// (its stage and fence module; a resident needs none), or nil, meaning
// all, when only is "".
func neededModules(m *manifest.Manifest, only string) map[string]bool {
	if only == "" {
		return nil
	}
	needed := map[string]bool{}
	if ms := m.Session(only); ms != nil {
		needed[ms.Stage] = true
		if ms.Fence != manifest.FenceBuiltin && ms.Fence != manifest.FenceDrain {
			needed[ms.Fence] = true
		}
	}
	return needed
}

// onDevice reports whether session ms has an instance slot on the
// deployment's device (always, without [Config.WithDevice]) and belongs
// to its tenant (any, without [Config.WithTenant]).
func (d *Deployment) onDevice(ms *manifest.Session) bool {
	if d.byTenant && ms.TenantName() != d.tenant {
		return false
	}
	if d.device == "" {
		return true
	}
	for i := range max(ms.Instances, 1) {
		if ms.Devices[i%len(ms.Devices)] == d.device {
			return true
		}
	}
	return false
}

// deviceModules narrows needed (nil: all) to the modules of the sessions
// on the deployment's device.
func (d *Deployment) deviceModules(needed map[string]bool) map[string]bool {
	out := map[string]bool{}
	for i := range d.Manifest.Sessions {
		ms := &d.Manifest.Sessions[i]
		if !d.onDevice(ms) {
			continue
		}
		for _, mod := range []string{ms.Stage, ms.Fence} {
			if mod != manifest.FenceBuiltin && mod != manifest.FenceDrain && (needed == nil || needed[mod]) {
				out[mod] = true
			}
		}
	}
	return out
}

// wantsDevice reports whether the deployment opens the named device:
// every one without [Config.WithDevice]; with it, that one and the npu
// devices of its resident sessions.
func (d *Deployment) wantsDevice(name string) bool {
	if d.device == "" || name == d.device {
		return true
	}
	for _, r := range d.Manifest.Residents {
		if r.GPU == d.device && r.NPU == name {
			return true
		}
	}
	return false
}

// cacheEntries counts the files in a wazero file cache directory (it
// keeps them one level down, in a directory per wazero version), or
// returns 0 for "".
func cacheEntries(dir string) int {
	if dir == "" {
		return 0
	}
	n := 0
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && !strings.HasSuffix(e.Name(), ".tmp") {
			n++
		}
		return nil
	})
	return n
}

func (d *Deployment) openDevices() error {
	for i := range d.Manifest.Devices {
		md := &d.Manifest.Devices[i]
		if !d.wantsDevice(md.Name) {
			continue
		}
		switch md.Backend {
		case manifest.BackendSim:
			if d.simP == nil {
				d.simP = sim.New()
			}
			dev, err := d.simP.AddDevice(md.Name, md.Engine, sim.NewDeviceConfig().WithLatency(md.Sim.Latency).WithQueueDepth(md.Sim.QueueDepth))
			if err != nil {
				return fmt.Errorf("device %q: %w", md.Name, err)
			}
			d.devices[md.Name] = dev
		case manifest.BackendCUDA:
			if d.cudaP == nil {
				p, err := cuda.Open(cuda.NewConfig())
				if err != nil {
					return fmt.Errorf("device %q: %w", md.Name, err)
				}
				d.cudaP = p
			}
			dev, err := d.cudaP.Device(cudaDeviceName(md))
			if err != nil {
				return fmt.Errorf("device %q: %w", md.Name, err)
			}
			d.devices[md.Name] = dev
		default:
			return errdefs.Errorf(errdefs.ErrUnsupported, "device %q: backend %q", md.Name, md.Backend)
		}
	}
	return nil
}

// newSession makes the session's handle, before its instances: its
// stage and fence modules are the manifest's.
func (d *Deployment) newSession(ms *manifest.Session) *Pool {
	s := &Pool{Spec: ms, d: d, stage: d.modules[ms.Stage]}
	if ms.Fence != manifest.FenceBuiltin && ms.Fence != manifest.FenceDrain {
		s.fence = d.modules[ms.Fence]
	}
	return s
}

// open makes the session's instances, one per slot over its devices in
// turn, and its pool.
func (s *Pool) open(ctx context.Context) error {
	devs := s.slotDevices()
	insts, err := s.makeInstances(ctx, s.stage, devs)
	if err != nil {
		return err
	}
	s.setPool(insts, devs)
	return nil
}

// setPool gives a session with no pool yet (at start, or a failed one
// that is reset) its instances.
func (s *Pool) setPool(insts []*instance, devs []string) {
	d := s.d
	busy := func(dev string) bool { return d.Runtime.LaneBusy(dev, host.LaneCompute) }
	p := newPool(s.Spec.Name, insts, devs, s.Spec.QueueLimit, s.Spec.QueueTimeout, busy, instanceDown)
	p.dispose = s.dispose
	s.mu.Lock()
	s.pool, s.failed = p, nil
	s.mu.Unlock()
}

// makeInstances makes one instance of stage per device of devs; if one
// cannot be made, it closes those it made and returns the error.
func (s *Pool) makeInstances(ctx context.Context, stage *stages.Module, devs []string) ([]*instance, error) {
	insts := make([]*instance, 0, len(devs))
	for i, dev := range devs {
		in, err := s.makeInstance(ctx, stage, i, len(devs), dev)
		if err != nil {
			for _, made := range insts {
				_ = made.s.Close(context.WithoutCancel(ctx))
			}
			if len(devs) > 1 {
				err = fmt.Errorf("instance %d of %d, on device %q: %w", i, len(devs), dev, err)
			}
			return nil, err
		}
		insts = append(insts, in)
	}
	s.gen++
	return insts, nil
}

// makeInstance makes the instance at index i of n, of stage, on dev, with
// a fresh owner. Owners are named apart: the session's name, /i when it
// has more than one instance, and .G for the instances made after the
// first generation (traces, quarantine).
func (s *Pool) makeInstance(ctx context.Context, stage *stages.Module, i, n int, dev string) (*instance, error) {
	ms, d := s.Spec, s.d
	name := ms.Name
	if n > 1 {
		name = fmt.Sprintf("%s/%d", ms.Name, i)
	}
	if s.gen > 0 {
		name = fmt.Sprintf("%s.%d", name, s.gen)
	}
	cfg := stages.NewSessionConfig(name, d.devices[dev]).
		WithStreams(ms.Streams...).WithPrograms(ms.Programs...).
		WithBudget(ms.Budget).WithOutputLimit(int(ms.OutputLimit)).
		WithDeadline(ms.Deadline).WithFenceTimeout(ms.FenceTimeout).WithInitTimeout(ms.InitTimeout).
		WithResetPerCall(ms.Reset == manifest.ResetCall)
	for _, b := range ms.Buffers {
		cfg = cfg.WithBuffer(b.Name, int(b.Size))
	}
	switch ms.Fence {
	case manifest.FenceBuiltin:
	case manifest.FenceDrain:
		cfg = cfg.WithDrainFence()
	default:
		cfg = cfg.WithFenceModule(s.fence)
	}
	cfg = cfg.WithKernels(d.sessionKernels(ms)...)
	cfg, err := d.vendorPrograms(ctx, ms, d.devices[dev], cfg)
	if err != nil {
		return nil, err
	}
	ws, releaseWeights, err := d.sessionWeights(ctx, ms, dev)
	if err != nil {
		return nil, err
	}
	defer releaseWeights() // the session holds its own references
	cfg = cfg.WithWeights(ws...)
	ss, err := d.Engine.NewSession(ctx, d.Runtime, stage, cfg)
	if err != nil {
		return nil, err
	}
	return &instance{s: ss, stage: stage}, nil
}

// instance is one member of a session's pool: a Wasm stage session and
// the stage module it was made from.
type instance struct {
	s     *stages.Session
	stage *stages.Module
}

// retiredInstance is an instance taken out of service and out of the
// pool: a quarantined one keeps its resources (never closed), a failed
// one was closed.
type retiredInstance struct {
	in     *instance
	index  int
	device string
	state  string // "quarantined" or "failed"
	reason string
	kept   bool // its owner's resources stay kept and counted
	at     time.Time
}

// dispose takes a retired instance that no call holds: a healthy or
// failed one is closed; a quarantined one keeps its resources. Out of
// service ones are listed in the session's status.
func (s *Pool) dispose(m *member[*instance]) {
	in := m.val
	r := &retiredInstance{in: in, index: m.index, device: m.device, at: time.Now()}
	if q := in.s.Quarantined(); q != nil {
		r.state, r.reason, r.kept = "quarantined", q.Error(), true
	} else {
		failed := in.s.Failed()
		err := in.s.Close(context.Background())
		switch {
		case errors.Is(err, errdefs.ErrDeviceLost): // quarantined as it closed: its resources stay
			r.state, r.reason, r.kept = "quarantined", err.Error(), true
		case failed != nil:
			r.state, r.reason = "failed", failed.Error()
		default:
			if err != nil {
				s.d.logger.Warn("closing a retired instance", "session", s.Spec.Name, "instance", m.index, "err", err)
			}
			return
		}
	}
	s.mu.Lock()
	s.retired = append(s.retired, r)
	s.mu.Unlock()
}

// instanceDown reports why an instance is out of service: quarantined,
// or failed (a replacement that could not be made); nil while it serves.
func instanceDown(in *instance) error {
	if q := in.s.Quarantined(); q != nil {
		return q
	}
	return in.s.Failed()
}

func simFault(k manifest.FaultKind, count int) sim.Fault {
	kinds := map[manifest.FaultKind]sim.FaultKind{
		manifest.FaultReject: sim.RejectSubmit, manifest.FaultFailCompletion: sim.FailCompletion,
		manifest.FaultHang: sim.Hang, manifest.FaultFailVisibility: sim.FailVisibility, manifest.FaultLose: sim.Lose,
	}
	return sim.Fault{Kind: kinds[k], Count: count}
}

// injectFaults applies the manifest's start-up faults. Hangs are never
// released: they model a device that stopped responding.
func (d *Deployment) injectFaults() error {
	for i := range d.Manifest.Devices {
		md := &d.Manifest.Devices[i]
		if md.Sim == nil || d.devices[md.Name] == nil { // not opened (Config.WithDevice)
			continue
		}
		dev := d.devices[md.Name].(*sim.Device)
		for _, f := range md.Sim.Faults {
			if f.Session == "" {
				dev.Inject(simFault(f.Kind, f.Count))
				continue
			}
			s := d.sessions[f.Session]
			if s == nil && d.Manifest.Session(f.Session) != nil {
				continue // not opened (Config.WithOnly, Config.WithDevice)
			}
			if s == nil {
				return errdefs.Errorf(errdefs.ErrNotFound, "device %q: fault for unknown session %q", md.Name, f.Session)
			}
			for _, m := range s.members() { // none when failed
				if m.device != md.Name {
					continue
				}
				for _, st := range m.val.s.Owner().Streams() {
					st.(*sim.Stream).Inject(simFault(f.Kind, f.Count))
				}
			}
		}
	}
	return nil
}

// Device is the device opened for a manifest device name (nil for a
// name not opened).
func (d *Deployment) Device(name string) hw.Device { return d.devices[name] }

// DeviceNames lists the devices opened, in manifest order: all of them,
// or with [Config.WithDevice] those it opens.
func (d *Deployment) DeviceNames() []string {
	names := make([]string, 0, len(d.Manifest.Devices))
	for _, md := range d.Manifest.Devices {
		if d.devices[md.Name] != nil {
			names = append(names, md.Name)
		}
	}
	return names
}

// DeviceErr returns nil while the named device is healthy, and an
// [errdefs.ErrDeviceLost] error naming the cause once it is lost (or an
// [errdefs.ErrNotFound] error for an unknown name).
func (d *Deployment) DeviceErr(name string) error {
	dev := d.devices[name]
	if dev == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "no device %q", name)
	}
	return dev.Err()
}

// Pool returns the pool that serves the manifest session called name, or
// nil when the deployment has none (no such session, or not opened: see
// [Config.WithOnly] and [Config.WithDevice]).
func (d *Deployment) Pool(name string) *Pool { return d.sessions[name] }

// Resident returns a resident session template by name, or nil.
func (d *Deployment) Resident(name string) *Resident { return d.residents[name] }

// FailedSessions lists, in manifest order, the sessions that could not be
// created.
func (d *Deployment) FailedSessions() []string {
	var names []string
	for _, name := range d.SessionNames() {
		if d.sessions[name].Failed() != nil {
			names = append(names, name)
		}
	}
	return names
}

// SessionNames lists the sessions in manifest order (with
// [Config.WithOnly], at most that one).
func (d *Deployment) SessionNames() []string {
	var names []string
	for _, s := range d.Manifest.Sessions {
		if d.sessions[s.Name] != nil {
			names = append(names, s.Name)
		}
	}
	return names
}

// ResidentNames lists the resident sessions in manifest order (with
// [Config.WithOnly], at most that one).
func (d *Deployment) ResidentNames() []string {
	var names []string
	for _, r := range d.Manifest.Residents {
		if d.residents[r.Name] != nil {
			names = append(names, r.Name)
		}
	}
	return names
}

// DefaultInput reads the session's default input file, or returns nil.
// Like every file a manifest names, it must be a regular file of at most
// [manifest.MaxInputSize] bytes.
func (s *Pool) DefaultInput() ([]byte, error) {
	if s.Spec.Input == "" {
		return nil, nil
	}
	return manifest.ReadFile(s.Spec.Input, manifest.MaxInputSize)
}

// Exclusive reports whether the session's placement is exclusive: in a
// lattice, one host at a time serves it.
func (s *Pool) Exclusive() bool { return s.Spec.Placement == manifest.PlacementExclusive }

// Failed returns why the session could not be created, or nil.
func (s *Pool) Failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// members returns the session's current instances (none when failed).
func (s *Pool) members() []*member[*instance] {
	s.mu.Lock()
	p := s.pool
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.members()
}

// Run calls the session's stage with input on a free instance: it
// takes one ([Pool.Acquire]), runs the call and gives it back.
//
// # Errors
//
// As for [Pool.Acquire] and [Turn.Run].
//
// Every call is counted by its [Outcome]: ok, an error class, or
// client_closed when ctx was cancelled (the caller went away).
func (s *Pool) Run(ctx context.Context, input []byte) ([]byte, error) {
	t, err := s.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer t.Release()
	return t.Run(ctx, input)
}

// Turn is one call's hold on one instance of a session, from
// [Pool.Acquire] to [Turn.Release]. It runs at most one call.
type Turn struct {
	s *Pool
	p *pool[*instance]
	m *member[*instance]
}

// Acquire takes a free instance of the session for one call, waiting for
// one in arrival order if none is free. The service acquires before it
// reads a request's body, so a call that will be refused costs nothing.
// A failed acquisition is counted as the call's outcome.
//
// # Errors
//
//   - an error wrapping [ErrUnavailable] and the reason if the session
//     could not be created;
//   - [errdefs.ErrBusy] when queue_limit calls are already waiting, or no
//     instance came free within queue_timeout;
//   - [errdefs.ErrDeadlineExceeded] if ctx ends while waiting;
//   - the reason an instance is out of service (quarantined: class
//     [errdefs.ErrDeviceLost]), when every instance is.
func (s *Pool) Acquire(ctx context.Context) (*Turn, error) {
	sctx, span := childSpan(ctx, tracing.SpanAcquire) // trace.go
	if span.IsRecording() {
		span.SetAttributes(tracing.SessionKey.String(s.Spec.Name))
	}
	s.mu.Lock()
	p, failed := s.pool, s.failed
	s.mu.Unlock()
	var err error
	if failed != nil {
		err = &unavailableError{s.Spec.Name, failed}
	} else {
		var m *member[*instance]
		if m, err = p.acquire(sctx); err == nil {
			if span.IsRecording() {
				span.SetAttributes(tracing.InstanceKey.Int(m.index), tracing.DeviceKey.String(m.device))
			}
			endChild(ctx, span, nil)
			return &Turn{s: s, p: p, m: m}, nil
		}
	}
	endChild(ctx, span, err)
	s.count(Outcome(ctx, err))
	return nil, err
}

// Module returns the stage module this turn's instance runs.
func (t *Turn) Module() *stages.Module { return t.m.val.stage }

// Module returns the session's current stage module (the one new calls
// run), nil when it is not loaded.
func (s *Pool) Module() *stages.Module {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stage
}

// TryAcquire takes a free instance of the session for one call if one is
// free now and no caller is waiting, and returns nil otherwise (a session
// that failed, or whose instances are all busy or out of service). It
// never waits and counts no outcome: a router tries the local session
// first and sends the call elsewhere when it gets nil.
func (s *Pool) TryAcquire() *Turn {
	s.mu.Lock()
	p, failed := s.pool, s.failed
	s.mu.Unlock()
	if failed != nil || p == nil {
		return nil
	}
	if m := p.tryAcquire(); m != nil {
		return &Turn{s: s, p: p, m: m}
	}
	return nil
}

// Instance names the instance the turn holds: its index and device.
func (t *Turn) Instance() (index int, device string) { return t.m.index, t.m.device }

// StageSHA256 is the sha256 of the stage module of the turn's instance:
// the module the call will run, whatever swap happened since.
func (t *Turn) StageSHA256() string { return t.m.val.stage.SHA256() }

// StageSHA256 is the sha256 of the stage module of the session's current
// instances ("" for a session never created and with no module loaded):
// after a swap, the new module's.
func (s *Pool) StageSHA256() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stage == nil {
		return ""
	}
	return s.stage.SHA256()
}

// Draining counts the session's instances replaced by a swap or a reset
// whose call still runs: 0 once every call on a replaced instance has
// ended.
func (s *Pool) Draining() int {
	s.mu.Lock()
	p := s.pool
	s.mu.Unlock()
	if p == nil {
		return 0
	}
	return len(p.drainingMembers())
}

// Run calls the stage on the turn's instance, and counts the outcome.
//
// # Errors
//
// As for [stages.Session.RunEntry].
func (t *Turn) Run(ctx context.Context, input []byte) (out []byte, err error) {
	sctx, span := childSpan(ctx, tracing.SpanStage) // trace.go
	if span.IsRecording() {
		span.SetAttributes(tracing.SessionKey.String(t.s.Spec.Name), tracing.InstanceKey.Int(t.m.index), tracing.DeviceKey.String(t.m.device))
	}
	defer func() {
		endChild(ctx, span, err)
		t.s.count(Outcome(ctx, err))
	}()
	if d := t.s.d; d.overdue != nil {
		defer t.watchOverdue(d)()
	}
	return t.m.val.s.RunEntry(sctx, t.s.Spec.Entry, input, nil)
}

// watchOverdue arms the deployment's overdue watch for the turn's call,
// which starts now; the returned func disarms it. The watch counts from
// the session's deadline, not the caller's (see [Overdue]).
func (t *Turn) watchOverdue(d *Deployment) (stop func()) {
	deadline := time.Now().Add(t.s.Spec.Deadline)
	o := Overdue{Session: t.s.Spec.Name, Instance: t.m.index, Device: t.m.device, Deadline: deadline, Grace: d.overdueGrace}
	timer := time.AfterFunc(time.Until(deadline.Add(d.overdueGrace)), func() { d.overdue(o) })
	return func() { timer.Stop() }
}

// Release gives the instance back: to the next caller waiting, or to the
// free instances. An instance quarantined by the call leaves service; one
// replaced during the call (a swap, a reset) is closed now, unless it is
// quarantined.
func (t *Turn) Release() { t.p.release(t.m) }

func (s *Pool) count(outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if outcome != errdefs.ClassOK {
		s.fails++
	}
	if s.outcomes == nil {
		s.outcomes = map[string]uint64{}
	}
	s.outcomes[outcome]++
}

// SessionStatus describes a session for listings.
type SessionStatus struct {
	Name   string `json:"name"`
	Stage  string `json:"stage"`
	Device string `json:"device"` // the first of its devices
	// State is "ready" while at least one instance serves,
	// "quarantined" when every instance is quarantined or failed, and
	// "failed" when the session could not be created.
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Calls    uint64 `json:"calls"`
	Failures uint64 `json:"failures"`
	// Outcomes counts the calls by outcome: "ok", or an error class of
	// the service (docs/service.md), "client_closed" included.
	Outcomes map[string]uint64 `json:"outcomes"`
	// Replaced and BudgetBytes are summed over the instances.
	Replaced    int   `json:"instances_replaced"`
	BudgetBytes int64 `json:"budget_used_bytes"`
	// InstancesOut counts the instances out of service (quarantined or
	// failed); Waiting the calls waiting for a free instance.
	InstancesOut int              `json:"instances_out"`
	Waiting      int              `json:"waiting"`
	Instances    []InstanceStatus `json:"instances"`
	// StageSHA256 is the sha256 of the current instances' stage module
	// (Stage names it); Draining counts the instances replaced by a swap
	// or a reset whose call still runs.
	StageSHA256 string `json:"stage_sha256"`
	Draining    int    `json:"instances_draining"`
	// Retired lists the instances taken out of the pool while out of
	// service (by a reset, or a swap): a quarantined one keeps its
	// resources, counted in its budget and the runtime's quarantine.
	Retired []RetiredStatus `json:"instances_retired"`
}

// RetiredStatus describes an instance retired out of service.
type RetiredStatus struct {
	Index       int       `json:"index"`
	Device      string    `json:"device"`
	Owner       string    `json:"owner"`
	StageSHA256 string    `json:"stage_sha256"`
	State       string    `json:"state"` // "quarantined" (resources kept) or "failed" (closed)
	Reason      string    `json:"reason"`
	Kept        bool      `json:"resources_kept"`
	BudgetBytes int64     `json:"budget_used_bytes"`
	At          time.Time `json:"retired_at"`
}

// InstanceStatus describes one instance of a session.
type InstanceStatus struct {
	Index       int    `json:"index"`
	Device      string `json:"device"`
	State       string `json:"state"` // "ready", "quarantined" or "failed"
	Reason      string `json:"reason,omitempty"`
	Replaced    int    `json:"instances_replaced"`
	BudgetBytes int64  `json:"budget_used_bytes"`
}

// Status reports the session's state.
func (s *Pool) Status() SessionStatus {
	s.mu.Lock()
	calls, fails := s.calls, s.fails
	outcomes := make(map[string]uint64, len(s.outcomes))
	for k, v := range s.outcomes {
		outcomes[k] = v
	}
	p, failed, stage := s.pool, s.failed, s.stage
	retired := append([]*retiredInstance(nil), s.retired...)
	s.mu.Unlock()
	st := SessionStatus{Name: s.Spec.Name, Stage: s.Spec.Stage, Device: s.Spec.Device, State: "ready",
		Calls: calls, Failures: fails, Outcomes: outcomes, Instances: []InstanceStatus{}, Retired: []RetiredStatus{}}
	if stage != nil {
		st.Stage, st.StageSHA256 = stage.Name(), stage.SHA256()
	}
	for _, r := range retired {
		st.Retired = append(st.Retired, RetiredStatus{Index: r.index, Device: r.device, Owner: r.in.s.Name(),
			StageSHA256: r.in.stage.SHA256(), State: r.state, Reason: r.reason, Kept: r.kept,
			BudgetBytes: r.in.s.Owner().Budget().Used(), At: r.at})
	}
	if failed != nil {
		st.State, st.Reason = "failed", failed.Error()
		return st
	}
	members := p.members()
	for _, m := range members {
		inst := m.val.s
		is := InstanceStatus{Index: m.index, Device: m.device, State: "ready",
			Replaced: inst.Replacements(), BudgetBytes: inst.Owner().Budget().Used()}
		if q := inst.Quarantined(); q != nil {
			is.State, is.Reason = "quarantined", q.Error()
		} else if f := inst.Failed(); f != nil {
			is.State, is.Reason = "failed", f.Error()
		}
		if is.State != "ready" {
			st.InstancesOut++
			if st.Reason == "" {
				st.Reason = is.Reason
				if len(members) > 1 {
					st.Reason = fmt.Sprintf("instance %d: %s", m.index, is.Reason)
				}
			}
		}
		st.Replaced += is.Replaced
		st.BudgetBytes += is.BudgetBytes
		st.Instances = append(st.Instances, is)
	}
	if st.InstancesOut == len(members) {
		st.State = "quarantined"
	}
	_, _, st.Waiting = p.stats()
	st.Draining = len(p.drainingMembers())
	return st
}

// Statuses lists every session's status, sorted by name.
func (d *Deployment) Statuses() []SessionStatus {
	out := make([]SessionStatus, 0, len(d.sessions))
	for _, s := range d.sessions {
		out = append(out, s.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close closes every session (a quarantined one keeps its resources), the
// engine and the platforms.
func (d *Deployment) Close(ctx context.Context) error {
	var errs []error
	for _, s := range d.sessions {
		for _, m := range s.members() {
			if err := m.val.s.Close(ctx); err != nil && !errors.Is(err, errdefs.ErrDeviceLost) {
				errs = append(errs, err)
			}
		}
	}
	for _, r := range d.residents {
		r.closeAll()
	}
	d.vendor.close()
	if d.Engine != nil {
		errs = append(errs, d.Engine.Close(ctx))
	}
	if d.simP != nil {
		_ = d.simP.Close()
	}
	if d.cudaP != nil {
		_ = d.cudaP.Close()
	}
	return errors.Join(errs...)
}

// residentOwnerName names the owner of one resident run.
func residentOwnerName(name string, run int) string { return fmt.Sprintf("%s#%d", name, run) }
