package stages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
)

// EngineConfig configures an [Engine]. It is immutable: every WithX
// method returns a modified copy.
type EngineConfig struct {
	cacheDir   string
	noCache    bool
	logger     *slog.Logger
	mergeGap   int
	onCompile  func(name string, cached bool)
	maxMemPage uint32
	maxModule  int64
	snapshots  bool
	snapTime   time.Duration
	spares     int
	// uninterruptible, for in-package benchmarks only: modules are not
	// instrumented, so a guest cannot be interrupted. It is what raw
	// wazero does, the baseline interruption is measured against.
	uninterruptible bool
	// fixedGuestSources, for in-package tests only: instances read
	// wazero's deterministic clocks and random stream instead of the
	// host's (see guestConfig).
	fixedGuestSources bool
}

// NewEngineConfig returns the defaults:
//
//   - compilation cache in the user's cache directory,
//     $XDG_CACHE_HOME/stagehost/wazero or ~/.cache/stagehost/wazero
//     (see [EngineConfig.WithCacheDir]);
//   - the default slog logger for guest logs;
//   - data segments merged when they are at most 4 KiB apart;
//   - snapshots on, each initialisation at load bounded by
//     [DefaultSnapshotTimeout], and 2 spare instances per snapshotted
//     module ([EngineConfig.WithSpareInstances]);
//   - modules of at most [DefaultMaxModuleSize] bytes.
func NewEngineConfig() EngineConfig {
	return EngineConfig{logger: slog.Default(), mergeGap: 4096, maxMemPage: 65536, maxModule: DefaultMaxModuleSize,
		snapshots: true, snapTime: DefaultSnapshotTimeout, spares: 2}
}

// WithSnapshots says whether [Engine.Load] takes a snapshot of each
// module's state after initialisation (data segments, start function,
// _initialize), so that its instances start from it in microseconds
// instead of initialising themselves (ABI.md §4.3). A module can opt out
// with [LoadConfig.WithSnapshot] or by exporting stagehost_no_snapshot.
// Default true.
func (c EngineConfig) WithSnapshots(on bool) EngineConfig { c.snapshots = on; return c }

// WithSpareInstances keeps n instances of each snapshotted module made
// ahead of time, from its snapshot, so that a new session or the
// replacement of a trapped instance takes one rather than instantiating;
// a background goroutine per module refills them, starting when the
// module's first session is made. n = 0 makes every instance when it is
// needed. Default 2.
func (c EngineConfig) WithSpareInstances(n int) EngineConfig { c.spares = max(n, 0); return c }

// WithSnapshotTimeout bounds the initialisation that [Engine.Load] runs
// to take a module's snapshot. A module that does not initialise in time
// is not snapshotted: each of its instances initialises itself, under
// its session's init timeout. Default [DefaultSnapshotTimeout].
func (c EngineConfig) WithSnapshotTimeout(d time.Duration) EngineConfig { c.snapTime = d; return c }

// WithCacheDir puts wazero's file-backed compilation cache in dir, so each
// module compiles once per machine rather than once per process. An empty
// dir disables the file cache (modules still compile once per Engine).
func (c EngineConfig) WithCacheDir(dir string) EngineConfig {
	c.cacheDir, c.noCache = dir, dir == ""
	return c
}

// DefaultMaxModuleSize is the largest module [Engine.Load] and [Validate]
// accept by default: 64 MiB.
const DefaultMaxModuleSize = 64 << 20

// WithMaxModuleSize sets the largest module, in bytes, that [Engine.Load]
// accepts when its [LoadConfig] sets no limit of its own
// ([LoadConfig.WithMaxSize]); a larger one is refused with
// [errdefs.ErrInvalidArgument] before it is hashed or parsed. Zero or
// less means no limit. [Validate] has no engine: it applies the
// LoadConfig's limit or [DefaultMaxModuleSize], never this one.
// Default [DefaultMaxModuleSize].
func (c EngineConfig) WithMaxModuleSize(bytes int64) EngineConfig { c.maxModule = bytes; return c }

// WithLogger sets where guest logs and guest stdout/stderr go. Default
// slog.Default().
func (c EngineConfig) WithLogger(l *slog.Logger) EngineConfig {
	c.logger = l
	return c
}

// WithCompileProgress calls fn before each compilation that is not served
// from the in-process cache, so a CLI can show progress (a Go guest takes
// about a second to compile cold). Default none.
func (c EngineConfig) WithCompileProgress(fn func(name string, cached bool)) EngineConfig {
	c.onCompile = fn
	return c
}

// Engine compiles and instantiates modules. One Engine per process is
// enough; it is safe for concurrent use.
type Engine struct {
	cfg      EngineConfig
	rc       wazero.RuntimeConfig // without the cache
	runtime  wazero.Runtime
	cache    wazero.CompilationCache
	cacheDir string
	// guestConfig is every instance's module configuration, its WASI
	// clocks and random source included (see guestConfig).
	guestConfig wazero.ModuleConfig

	mu      sync.Mutex
	modules map[string]*Module // by sha256 of the original bytes and load options

	// uncached is a runtime without the file cache, made when the cache
	// cannot be written (a full disk, a read-only directory): the modules
	// compiled then are compiled there, and instantiate there.
	uncachedMu sync.Mutex
	uncached   wazero.Runtime
	inUncached sync.Map // wazero.CompiledModule -> struct{}: compiled by uncached
}

var sessionTags atomic.Uint32

// nextTag returns a session tag in [1, abi.MaxTag].
func nextTag() uint32 {
	for {
		t := sessionTags.Add(1) & abi.MaxTag
		if t != 0 {
			return t
		}
	}
}

// DefaultCacheDir is the compilation cache directory used by default.
func DefaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "stagehost-cache", "wazero")
	}
	return filepath.Join(dir, "stagehost", "wazero")
}

// NewEngine creates an engine: a wazero runtime with the compilation
// cache, the stagehost_v1 host module and WASI preview 1.
//
//	eng, err := stages.NewEngine(ctx, stages.NewEngineConfig())
//	defer eng.Close(ctx)
//
// # Errors
//
// [errdefs.ErrUnsupported] if the cache directory cannot be created.
func NewEngine(ctx context.Context, cfg EngineConfig) (*Engine, error) {
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	// No WithCloseOnContextDone: guests are interrupted by the
	// instrumentation Load adds (RATIONALE.md).
	rc := wazero.NewRuntimeConfigCompiler().
		WithMemoryLimitPages(cfg.maxMemPage)
	e := &Engine{cfg: cfg, rc: rc, modules: map[string]*Module{}, guestConfig: guestConfig(cfg.fixedGuestSources)}
	if !cfg.noCache {
		dir := cfg.cacheDir
		if dir == "" {
			dir = DefaultCacheDir()
		}
		cache, err := wazero.NewCompilationCacheWithDir(dir)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrUnsupported, "compilation cache %s: %w", dir, err)
		}
		e.cache, e.cacheDir = cache, dir
		rc = rc.WithCompilationCache(cache)
	}
	e.runtime = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, e.runtime); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "wasi: %w", err)
	}
	if err := instantiateHostModule(ctx, e.runtime); err != nil {
		return nil, err
	}
	return e, nil
}

// Close releases the engine and every module instance it made.
func (e *Engine) Close(ctx context.Context) error {
	// The spares' goroutines stop first: they instantiate in the runtime.
	e.mu.Lock()
	for _, m := range e.modules {
		m.closeSnapshot()
	}
	e.mu.Unlock()
	err := e.runtime.Close(ctx)
	e.uncachedMu.Lock()
	if e.uncached != nil {
		if uerr := e.uncached.Close(ctx); err == nil {
			err = uerr
		}
	}
	e.uncachedMu.Unlock()
	if e.cache != nil {
		_ = e.cache.Close(ctx)
	}
	return err
}

// SHA256 returns the lowercase hex sha256 of bin, the form [Engine.Load]
// expects.
func SHA256(bin []byte) string {
	sum := sha256.Sum256(bin)
	return hex.EncodeToString(sum[:])
}

func instantiateHostModule(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(abi.ImportModule)
	for name, fn := range hostFunctions {
		sig := abi.Functions[name]
		b.NewFunctionBuilder().
			WithGoModuleFunction(stackBased(name, fn), sig.Params, sig.Results).
			WithName(name).
			Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return errdefs.Errorf(errdefs.ErrUnsupported, "host module: %w", err)
	}
	ib := r.NewHostModuleBuilder(abi.InternalModule)
	ib.NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostYield), nil, []api.ValueType{api.ValueTypeI32}).
		WithName(abi.FnYield).
		Export(abi.FnYield)
	if _, err := ib.Instantiate(ctx); err != nil {
		return errdefs.Errorf(errdefs.ErrUnsupported, "host module %s: %w", abi.InternalModule, err)
	}
	return nil
}

// compile compiles bin through the file cache. When that fails and a
// cache is in use, the cause may be a corrupt or unreadable cache entry
// rather than the module: compile deletes the module's entry (if
// the module compiles without it), logs a warning, and compiles again.
func (e *Engine) compile(ctx context.Context, name string, bin []byte) (wazero.CompiledModule, error) {
	c, err := e.runtime.CompileModule(ctx, bin)
	if err == nil || e.cache == nil {
		return c, err
	}
	removed, perr := e.removeCacheEntry(ctx, bin)
	if perr == nil && removed != "" {
		e.cfg.logger.Warn("deleted an unreadable compilation cache entry and compiled the module again",
			"module", name, "entry", removed, "error", err)
		if c, err2 := e.runtime.CompileModule(ctx, bin); err2 == nil {
			return c, nil
		}
	}
	// The cache cannot be read or written (a full disk, a read-only
	// directory): the module is compiled without it, in a runtime of its
	// own. If it does not compile there either, that error is the
	// module's own.
	rt, uerr := e.uncachedRuntime(ctx)
	if uerr != nil {
		return nil, err
	}
	c, cerr := rt.CompileModule(ctx, bin)
	if cerr != nil {
		return nil, cerr
	}
	e.inUncached.Store(c, struct{}{})
	e.cfg.logger.Warn("the compilation cache cannot be used: compiled the module without it (it is compiled again at the next start)",
		"module", name, "cache_dir", e.cacheDir, "error", err)
	return c, nil
}

// uncachedRuntime returns the engine's runtime without the file cache,
// making it (with WASI and the host modules) the first time.
func (e *Engine) uncachedRuntime(ctx context.Context) (wazero.Runtime, error) {
	e.uncachedMu.Lock()
	defer e.uncachedMu.Unlock()
	if e.uncached != nil {
		return e.uncached, nil
	}
	rt := wazero.NewRuntimeWithConfig(ctx, e.rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "wasi: %w", err)
	}
	if err := instantiateHostModule(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, err
	}
	e.uncached = rt
	return rt, nil
}

// runtimeOf returns the runtime that compiled c, the one it instantiates
// in.
func (e *Engine) runtimeOf(c wazero.CompiledModule) wazero.Runtime {
	if _, ok := e.inUncached.Load(c); ok {
		e.uncachedMu.Lock()
		defer e.uncachedMu.Unlock()
		return e.uncached
	}
	return e.runtime
}

// removeCacheEntry finds the cache file that holds bin's compiled code,
// by compiling bin once more into an empty cache directory of its own
// (entries are named by a hash of the module, the engine configuration
// and the CPU, so the name is the same), and deletes that file from the
// engine's cache. It returns the deleted file's path, or "" if bin does
// not compile at all or the cache has no such entry.
func (e *Engine) removeCacheEntry(ctx context.Context, bin []byte) (string, error) {
	tmp, err := os.MkdirTemp("", "stagehost-cache-probe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cache, err := wazero.NewCompilationCacheWithDir(tmp)
	if err != nil {
		return "", err
	}
	defer cache.Close(ctx)
	r := wazero.NewRuntimeWithConfig(ctx, e.rc.WithCompilationCache(cache))
	defer r.Close(ctx)
	if _, err := r.CompileModule(ctx, bin); err != nil {
		return "", nil // the module itself does not compile
	}
	removed := ""
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || strings.HasSuffix(p, ".tmp") {
			return err
		}
		rel, err := filepath.Rel(tmp, p)
		if err != nil {
			return err
		}
		target := filepath.Join(e.cacheDir, rel)
		if err := os.Remove(target); err == nil {
			removed = target
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
	return removed, err
}
