package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages/internal/wasmbin"
)

// ModuleKind says what a module provides.
type ModuleKind uint8

const (
	// StageModule provides stagehost_run (and may provide a fence).
	StageModule ModuleKind = iota
	// FenceModule provides stagehost_fence only.
	FenceModule
)

func (k ModuleKind) String() string {
	if k == FenceModule {
		return "fence"
	}
	return "stage"
}

// MaxTableElements caps the maximum of every table a stage, fence or
// vendor kernel module defines: 1,048,576 elements (8 MiB of references
// in the engine). table.grow past it returns -1, as the Wasm spec has it
// for a table at its maximum, and a module whose table's minimum is
// above it is refused at load. Without the cap a module could grow a
// table without bound: the memory limit covers linear memory only.
const MaxTableElements = 1 << 20

// GrantGoRuntime is the WASI grant that a Go (GOOS=wasip1) guest needs:
// exactly the functions in [abi.GoRuntimeWASI].
const GrantGoRuntime = "go-runtime"

// LoadConfig configures [Engine.Load]. It is immutable: every WithX method
// returns a modified copy.
type LoadConfig struct {
	name        string
	kind        ModuleKind
	memoryPages uint32
	wasi        []string
	maxSize     int64 // 0: the engine's limit ([Validate]: DefaultMaxModuleSize)
	noSnapshot  bool
}

// NewLoadConfig returns the defaults: kind [StageModule], a memory limit
// of 64 MiB, no WASI, and the name "module".
func NewLoadConfig() LoadConfig {
	return LoadConfig{name: "module", kind: StageModule, memoryPages: 1024}
}

// WithName names the module in errors, logs and traces.
func (c LoadConfig) WithName(name string) LoadConfig { c.name = name; return c }

// WithKind says whether the module is a stage or a fence module.
func (c LoadConfig) WithKind(k ModuleKind) LoadConfig { c.kind = k; return c }

// WithMemoryLimit caps the module's linear memory at bytes, rounded down
// to 64 KiB pages and at most 4 GiB. A module that declares a larger
// maximum, or a larger minimum, is rejected; one with no maximum gets
// this one. Default 64 MiB.
func (c LoadConfig) WithMemoryLimit(bytes int64) LoadConfig {
	c.memoryPages = uint32(min(max(bytes, 0)>>16, 65536))
	return c
}

// WithMaxSize refuses a module larger than bytes, with
// [errdefs.ErrInvalidArgument], before it is parsed; less than zero means
// no limit. Default (and zero): the engine's limit
// ([EngineConfig.WithMaxModuleSize]); for [Validate],
// [DefaultMaxModuleSize].
func (c LoadConfig) WithMaxSize(bytes int64) LoadConfig { c.maxSize = bytes; return c }

// WithSnapshot says whether instances of the module start from a
// snapshot of its state after initialisation, taken once at load (ABI.md
// §4.3), or initialise themselves. Default true; the engine's
// [EngineConfig.WithSnapshots] can turn snapshots off for every module.
func (c LoadConfig) WithSnapshot(on bool) LoadConfig { c.noSnapshot = !on; return c }

// WithWASI grants WASI preview 1 functions: [GrantGoRuntime], or names
// from [abi.GoRuntimeWASI]. Nothing else can be granted. Default none.
func (c LoadConfig) WithWASI(grants ...string) LoadConfig {
	c.wasi = append([]string(nil), grants...)
	return c
}

// Module is a validated, compiled module, ready to instantiate per session.
type Module struct {
	name          string
	kind          ModuleKind
	sha256        string
	compiled      wazero.CompiledModule
	engine        *Engine
	hasFence      bool
	hasInit       bool
	hasInitialize bool
	wasi          bool
	memoryPages   uint32
	segments      [2]int    // data segments before and after merging
	snap          *snapshot // nil: every instance initialises itself
	spares        *spares   // instances made ahead from snap
	noSnapshot    string    // why snap is nil
	tableShift    uint32    // leading table entries dropped (wasmbin.Module.CompactTable)
	// hasStart: the module has a start section. Instantiating one
	// without can still trap (a data segment out of bounds), which is
	// then not named a start function's failure.
	hasStart bool
	// startDesc is how the engine names the start function of the
	// compiled module and of the module as loaded (wasmbin.StartDesc);
	// equal (both empty) without instrumentation or a start section.
	startDesc [2]string
	requires  *abi.Requires // its stagehost.requires section; nil without one
}

// Name is the module's name.
func (m *Module) Name() string { return m.name }

// Kind is what the module provides.
func (m *Module) Kind() ModuleKind { return m.kind }

// SHA256 is the hex sha256 of the module's bytes as loaded.
func (m *Module) SHA256() string { return m.sha256 }

// Requires returns the module's declared requirements (its
// stagehost.requires section, abi/ABI.md §7), nil when it has none. The
// caller must not modify them.
func (m *Module) Requires() *abi.Requires { return m.requires }

// HasFence reports whether the module exports stagehost_fence.
func (m *Module) HasFence() bool { return m.hasFence }

// Snapshot reports whether the module's instances start from a snapshot
// taken at load and, when they do not, why.
func (m *Module) Snapshot() (bool, string) { return m.snap != nil, m.noSnapshot }

// Close releases the compiled module and its snapshot, and the engine
// forgets it: loading the same bytes again compiles them anew. Close the
// sessions made from the module first; a quarantined session's instance
// may outlive it (its resources are kept; wazero lets an instance outlive
// its compiled module). Closing a closed module does nothing.
func (m *Module) Close(ctx context.Context) error {
	e := m.engine
	e.mu.Lock()
	found := false
	for k, v := range e.modules {
		if v == m {
			delete(e.modules, k)
			found = true
		}
	}
	e.mu.Unlock()
	if !found {
		return nil
	}
	m.closeSnapshot()
	e.inUncached.Delete(m.compiled)
	return m.compiled.Close(ctx)
}

// Load validates a module and compiles it. Validation happens before
// anything is instantiated, in this order: sha256, structure, ABI marker,
// imports (only stagehost_v1 functions with their exact types, and WASI
// functions granted by cfg), required exports and their types, and memory
// limits. The module is then rewritten (memory maximum capped, data
// segments merged) and compiled, through the file cache. Loading the same
// bytes with the same configuration again returns the same *Module.
//
//	bin, _ := os.ReadFile("stage.wasm")
//	mod, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("mlp"))
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument]: larger than the size limit
//     ([LoadConfig.WithMaxSize]), sha256 mismatch, malformed binary, missing
//     or duplicated ABI marker, forbidden import, missing export, wrong
//     export type, memory above the limit. The message names the module
//     and the offending import, export or limit.
//   - [errdefs.ErrUnsupported]: the module targets another ABI version.
func (e *Engine) Load(ctx context.Context, bin []byte, sha256hex string, cfg LoadConfig) (*Module, error) {
	fail := func(class error, format string, args ...any) (*Module, error) {
		return nil, errdefs.Errorf(class, "module %q: "+format, append([]any{cfg.name}, args...)...)
	}
	if cfg.maxSize == 0 {
		cfg.maxSize = e.cfg.maxModule
	}
	if err := checkSize(bin, cfg); err != nil {
		return nil, err
	}
	sum := SHA256(bin)
	if sha256hex == "" {
		return fail(errdefs.ErrInvalidArgument, "no expected sha256 given (it is %s)", sum)
	}
	if !strings.EqualFold(sha256hex, sum) {
		return fail(errdefs.ErrInvalidArgument, "sha256 mismatch: expected %s, the bytes hash to %s", strings.ToLower(sha256hex), sum)
	}
	key := fmt.Sprintf("%s/%d/%d/%q/%s/%t", sum, cfg.kind, cfg.memoryPages, cfg.wasi, cfg.name, cfg.noSnapshot)
	e.mu.Lock()
	if m, ok := e.modules[key]; ok {
		e.mu.Unlock()
		return m, nil
	}
	e.mu.Unlock()

	m, parsed, err := validate(bin, cfg)
	if err != nil {
		return nil, err
	}
	m.sha256, m.engine, m.hasStart = sum, e, parsed.HasStart
	rewritten, st, err := parsed.Rewrite(wasmbin.RewriteOptions{MaxPages: cfg.memoryPages, MergeGap: e.cfg.mergeGap, MaxTableElements: MaxTableElements})
	if err != nil {
		return fail(errdefs.ErrInvalidArgument, "%v", err)
	}
	m.segments = [2]int{st.SegmentsBefore, st.SegmentsAfter}
	if !e.cfg.uninterruptible {
		if rewritten, m.startDesc, err = instrument(rewritten); err != nil {
			return fail(errdefs.ErrInvalidArgument, "%v", err)
		}
	}
	if e.cfg.onCompile != nil {
		e.cfg.onCompile(cfg.name, false)
	}
	var compiled wazero.CompiledModule
	switch {
	case cfg.noSnapshot:
		m.noSnapshot = "snapshots are turned off for the module"
	case !e.cfg.snapshots:
		m.noSnapshot = "snapshots are turned off for the engine"
	default:
		c, snap, why, err := e.takeSnapshot(ctx, m, rewritten)
		if err != nil {
			return fail(errdefs.ErrInvalidArgument, "does not compile: %v", err)
		}
		compiled, m.snap, m.noSnapshot = c, snap, why
		if snap != nil {
			m.spares = newSpares(m, e.cfg.spares)
		} else {
			e.cfg.logger.Info("module not snapshotted", "module", cfg.name, "why", why)
		}
	}
	if compiled == nil {
		if compiled, err = e.compile(ctx, cfg.name, rewritten); err != nil {
			return fail(errdefs.ErrInvalidArgument, "does not compile: %v", err)
		}
	}
	m.compiled = compiled
	e.mu.Lock()
	if prev, ok := e.modules[key]; ok { // a concurrent Load won
		e.mu.Unlock()
		_ = compiled.Close(ctx)
		m.closeSnapshot()
		return prev, nil
	}
	e.modules[key] = m
	e.mu.Unlock()
	return m, nil
}

// Validate runs every check [Engine.Load] makes before compiling (all but
// the sha256): structure, ABI marker, imports against cfg's WASI grants,
// exports, memory limits. It compiles and instantiates nothing, so tools
// can check modules cheaply.
//
// # Errors
//
// As for [Engine.Load].
func Validate(bin []byte, cfg LoadConfig) error {
	if cfg.maxSize == 0 {
		cfg.maxSize = DefaultMaxModuleSize
	}
	if err := checkSize(bin, cfg); err != nil {
		return err
	}
	_, parsed, err := validate(bin, cfg)
	if err != nil {
		return err
	}
	// The limits Load applies when it rewrites the module (the memory's
	// and the tables' minimums), so that what passes here loads.
	if _, _, err := parsed.Rewrite(wasmbin.RewriteOptions{MaxPages: cfg.memoryPages, MaxTableElements: MaxTableElements}); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: %v", cfg.name, err)
	}
	return nil
}

// instrument adds the interruption countdown (RATIONALE.md,
// "Interruption by instrumentation") to a rewritten binary. It also
// returns how the engine names the start function of the output and of
// the input in the error of a failed start (both empty without a start
// section), for [wasmbin.RenameStart].
func instrument(bin []byte) ([]byte, [2]string, error) {
	var desc [2]string
	p, err := wasmbin.Parse(bin)
	if err != nil {
		return nil, desc, err
	}
	out, _, err := wasmbin.Instrument(p, wasmbin.InterruptOptions{Module: abi.InternalModule, Name: abi.FnYield, Fuel: yieldFuel})
	if err != nil {
		return nil, desc, err
	}
	if want, ok := p.StartDesc(); ok {
		q, err := wasmbin.Parse(out)
		if err != nil {
			return nil, desc, err
		}
		got, _ := q.StartDesc()
		desc = [2]string{got, want}
	}
	return out, desc, nil
}

func checkSize(bin []byte, cfg LoadConfig) error {
	if cfg.maxSize > 0 && int64(len(bin)) > cfg.maxSize {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: %d bytes, more than the limit of %d bytes", cfg.name, len(bin), cfg.maxSize)
	}
	return nil
}

func validate(bin []byte, cfg LoadConfig) (*Module, *wasmbin.Module, error) {
	fail := func(class error, err error) (*Module, *wasmbin.Module, error) {
		return nil, nil, errdefs.Errorf(class, "module %q: %v", cfg.name, err)
	}
	parsed, err := wasmbin.Parse(bin)
	if err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	if err := parsed.ValidateCode(); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	m := &Module{name: cfg.name, kind: cfg.kind, memoryPages: cfg.memoryPages}
	if err := checkMarker(parsed); err != nil {
		return fail(errdefs.ClassOf(err), err)
	}
	grants, err := wasiGrants(cfg.wasi)
	if err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	if err := checkImports(parsed, grants); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	for _, im := range parsed.Imports {
		m.wasi = m.wasi || im.Module == abi.WASIModule
	}
	if err := checkCommand(parsed, m.wasi); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	if err := m.checkExports(parsed); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	if err := checkMemory(parsed, cfg.memoryPages); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	if m.requires, err = requiresOf(parsed); err != nil {
		return fail(errdefs.ErrInvalidArgument, err)
	}
	return m, parsed, nil
}

// requiresOf reads the stagehost.requires section of p, nil without one.
func requiresOf(p *wasmbin.Module) (*abi.Requires, error) {
	var found *wasmbin.Custom
	for i, c := range p.Customs {
		if c.Name != abi.RequiresSection {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("a second %s section at byte %d (the first is at byte %d)", abi.RequiresSection, c.At, found.At)
		}
		found = &p.Customs[i]
	}
	if found == nil {
		return nil, nil
	}
	return abi.ParseRequires(found.Payload)
}

// ReadRequires returns the declared requirements of the module bin (its
// stagehost.requires section), nil when it has none. It checks the
// binary's structure, not the rest of what [Validate] checks.
//
// # Errors
//
// [errdefs.ErrInvalidArgument]: a malformed binary, two such sections,
// or a section [abi.ParseRequires] refuses.
func ReadRequires(bin []byte) (*abi.Requires, error) {
	p, err := wasmbin.Parse(bin)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%v", err)
	}
	r, err := requiresOf(p)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%w", err)
	}
	return r, nil
}

// SetRequires returns the module bin with r as its stagehost.requires
// section: every such section bin has is dropped, and the new one is
// appended at the end. bin is not modified.
//
// # Errors
//
// [errdefs.ErrInvalidArgument]: a malformed binary, or r is not a valid
// document (it is checked as the host reads it, [abi.ParseRequires]).
func SetRequires(bin []byte, r *abi.Requires) ([]byte, error) {
	p, err := wasmbin.Parse(bin)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%v", err)
	}
	doc := r.Marshal()
	if _, err := abi.ParseRequires(doc); err != nil {
		return nil, err
	}
	return wasmbin.ReplaceCustom(p, abi.RequiresSection, doc), nil
}

func checkMarker(m *wasmbin.Module) error {
	var markers []wasmbin.Export
	for _, e := range m.Exports {
		if strings.HasPrefix(e.Name, abi.MarkerPrefix) {
			markers = append(markers, e)
		}
	}
	switch {
	case len(markers) == 0:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "missing ABI marker: a stagehost module must export the function %s", abi.Marker)
	case len(markers) > 1:
		names := make([]string, len(markers))
		for i, mk := range markers {
			names[i] = mk.Name
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "several ABI markers exported (%s): export exactly one", strings.Join(names, ", "))
	case markers[0].Name != abi.Marker:
		return errdefs.Errorf(errdefs.ErrUnsupported, "module targets ABI %s, this host implements ABI v%d (%s)",
			strings.TrimPrefix(markers[0].Name, "stagehost_abi_"), abi.Version, abi.Marker)
	}
	if err := checkFuncExport(markers[0], abi.ExportSignatures[abi.Marker]); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%v", err)
	}
	return nil
}

func wasiGrants(grants []string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, g := range grants {
		switch {
		case g == GrantGoRuntime:
			for _, f := range abi.GoRuntimeWASI {
				set[f] = true
			}
		case slices.Contains(abi.GoRuntimeWASI, g):
			set[g] = true
		default:
			return nil, fmt.Errorf("WASI grant %q cannot be given: grant %q or some of %s", g, GrantGoRuntime, strings.Join(abi.GoRuntimeWASI, ", "))
		}
	}
	return set, nil
}

func checkImports(m *wasmbin.Module, grants map[string]bool) error {
	var errs []error
	for _, im := range m.Imports {
		where := im.Module + "." + im.Name
		if im.Kind != wasmbin.KindFunc {
			errs = append(errs, fmt.Errorf("imports %s %s: only functions may be imported", wasmbin.KindName(im.Kind), where))
			continue
		}
		switch im.Module {
		case abi.ImportModule:
			sig, ok := abi.Functions[im.Name]
			if !ok {
				errs = append(errs, fmt.Errorf("imports %s, which ABI v1 does not define", where))
			} else if !sameSignature(im.Type, sig) {
				errs = append(errs, fmt.Errorf("imports %s with type %s, ABI v1 defines %s", where, formatType(im.Type), formatSig(sig)))
			}
		case abi.WASIModule:
			if !grants[im.Name] {
				how := fmt.Sprintf("grant it with wasi = [%q]", GrantGoRuntime)
				if !slices.Contains(abi.GoRuntimeWASI, im.Name) {
					how = "it can never be granted in ABI v1"
				}
				errs = append(errs, fmt.Errorf("imports %s, which is not granted (%s)", where, how))
			} else if sig := abi.WASISignatures[im.Name]; !sameSignature(im.Type, sig) {
				errs = append(errs, fmt.Errorf("imports %s with type %s, WASI preview 1 defines %s", where, formatType(im.Type), formatSig(sig)))
			}
		case abi.InternalModule:
			errs = append(errs, fmt.Errorf("imports %s: %s is reserved for the host's own instrumentation", where, abi.InternalModule))
		default:
			errs = append(errs, fmt.Errorf("imports %s: only %s functions and granted WASI functions may be imported", where, abi.ImportModule))
		}
	}
	return errors.Join(errs...)
}

// checkCommand refuses a WASI command: a module that imports WASI
// functions and exports _start, as a Go guest built without
// -buildmode=c-shared does. The host never calls _start (it calls the
// reactor's _initialize), so such a guest's runtime is never initialised
// and its first export call traps in runtime.notInitialized.
func checkCommand(p *wasmbin.Module, wasi bool) error {
	if _, ok := p.Export(abi.ExportStart); !ok || !wasi {
		return nil
	}
	return fmt.Errorf("exports %s and imports WASI: it is a WASI command, which the host never starts (a Go guest traps in runtime.notInitialized); a module must be a WASI reactor: build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared", abi.ExportStart)
}

func (m *Module) checkExports(p *wasmbin.Module) error {
	var errs []error
	if mem, ok := p.Export(abi.ExportMemory); !ok || mem.Kind != wasmbin.KindMemory {
		errs = append(errs, fmt.Errorf("must export its memory as %q", abi.ExportMemory))
	}
	need := abi.ExportRun
	if m.kind == FenceModule {
		need = abi.ExportFence
	}
	if _, ok := p.Export(need); !ok {
		errs = append(errs, fmt.Errorf("a %s module must export %s", m.kind, need))
	}
	for _, name := range []string{abi.ExportRun, abi.ExportFence, abi.ExportInit, abi.ExportInitialize, abi.ExportNoSnapshot} {
		e, ok := p.Export(name)
		if !ok {
			continue
		}
		if err := checkFuncExport(e, abi.ExportSignatures[name]); err != nil {
			errs = append(errs, err)
			continue
		}
		switch name {
		case abi.ExportFence:
			m.hasFence = true
		case abi.ExportInit:
			m.hasInit = true
		case abi.ExportInitialize:
			m.hasInitialize = true
		}
	}
	return errors.Join(errs...)
}

func checkFuncExport(e wasmbin.Export, want abi.Signature) error {
	if e.Kind != wasmbin.KindFunc {
		return fmt.Errorf("export %s must be a function, it is a %s", e.Name, wasmbin.KindName(e.Kind))
	}
	if !sameSignature(e.Type, want) {
		return fmt.Errorf("export %s has type %s, ABI v1 requires %s", e.Name, formatType(e.Type), formatSig(want))
	}
	return nil
}

func checkMemory(p *wasmbin.Module, limit uint32) error {
	if len(p.Memories) != 1 {
		return fmt.Errorf("defines %d memories, ABI v1 requires exactly one", len(p.Memories))
	}
	l := p.Memories[0]
	if l.Shared {
		return fmt.Errorf("its memory is shared, which ABI v1 does not allow")
	}
	if l.HasMax && l.Max > limit {
		return fmt.Errorf("memory maximum %d pages (%d MiB) is above the limit of %d pages (%d MiB)", l.Max, l.Max/16, limit, limit/16)
	}
	if l.Min > limit {
		return fmt.Errorf("memory minimum %d pages (%d MiB) is above the limit of %d pages (%d MiB)", l.Min, l.Min/16, limit, limit/16)
	}
	return nil
}

func sameSignature(t wasmbin.FuncType, s abi.Signature) bool {
	return bytes.Equal(t.Params, valueTypes(s.Params)) && bytes.Equal(t.Results, valueTypes(s.Results))
}

func valueTypes(v []api.ValueType) []byte {
	if len(v) == 0 {
		return nil
	}
	out := make([]byte, len(v))
	copy(out, v)
	return out
}

func formatSig(s abi.Signature) string {
	return formatType(wasmbin.FuncType{Params: valueTypes(s.Params), Results: valueTypes(s.Results)})
}

func formatType(t wasmbin.FuncType) string {
	names := func(v []byte) string {
		s := make([]string, len(v))
		for i, b := range v {
			s[i] = api.ValueTypeName(b)
		}
		return strings.Join(s, ",")
	}
	return "(" + names(t.Params) + ")->(" + names(t.Results) + ")"
}
