package stages

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/monotime"
	"github.com/stagehost/stagehost/stages/internal/wasmbin"
)

// A snapshot is a module's state after its language runtime initialised,
// taken once at load (RATIONALE.md, "Pre-initialised snapshots"): its
// linear memory and mutable globals after the data segments, the start
// function and _initialize. Every instance of the module then starts
// from it: its memory is a copy-on-write mapping of the snapshot's
// memory, its globals are set to the captured values, and only
// stagehost_init runs.
type snapshot struct {
	img     *memImage
	pages   uint32 // memory size after initialisation
	globals []snapGlobal
}

type snapGlobal struct {
	export string
	value  uint64
}

// Reserved export names of the module the engine compiles (see
// [wasmbin.Module.Freeze]): a module that exports them itself is not
// snapshotted.
const (
	snapGlobalPrefix = abi.InternalModule + ".global."
	snapStartExport  = abi.InternalModule + ".start"
)

// DefaultSnapshotTimeout bounds the initialisation run at load that a
// snapshot is taken of. Default of [EngineConfig.WithSnapshotTimeout].
const DefaultSnapshotTimeout = 5 * time.Second

// errTemplateHostCall unwinds an initialisation at load that calls a
// stagehost_v1 function: with no session, the call could not behave as it
// does in a session, so such a module is not snapshotted.
type errTemplateHostCall struct{ fn string }

func (e *errTemplateHostCall) Error() string {
	return "its initialisation calls " + abi.ImportModule + "." + e.fn
}

// guestConfig is the module configuration every instance starts from:
// no name, no start function (the host runs initialisation itself), and
// the WASI clocks and random source of ABI.md §1.2: the host's real
// monotonic and wall clocks, and the host's CSPRNG (crypto/rand), read
// afresh on every call of random_get. None of them keeps state that a
// guest's reads change, so nothing an instance or a call reads from them
// depends on what another instance, an earlier call or the snapshot's
// initialisation read (RATIONALE.md, "Real clocks and fresh entropy").
// fixed, for in-package tests only, keeps wazero's deterministic defaults
// (clocks that start at 0 and 2022-01-01 and advance 1 ms a reading, a
// fixed-seed random stream), to compare a snapshot with a fresh instance
// byte for byte.
func guestConfig(fixed bool) wazero.ModuleConfig {
	mc := wazero.NewModuleConfig().WithName("").WithStartFunctions()
	if fixed {
		return mc
	}
	return mc.WithSysNanotime().WithSysWalltime().WithRandSource(rand.Reader)
}

// takeSnapshot prepares a snapshot of an instrumented module: it derives
// the module the engine compiles (mutable globals and the start function
// exported, data segments and start section removed), compiles it, and
// initialises one template instance exactly as a session would (data
// segments, start function, _initialize), under the snapshot timeout. It
// returns the compiled module and its snapshot, or why the module cannot
// be snapshotted (the module then loads as it would without snapshots).
// An error is returned only for a derived module that does not compile.
func (e *Engine) takeSnapshot(ctx context.Context, m *Module, bin []byte) (wazero.CompiledModule, *snapshot, string, error) {
	p, err := wasmbin.Parse(bin)
	if err != nil {
		return nil, nil, err.Error(), nil
	}
	if _, ok := p.Export(abi.ExportNoSnapshot); ok {
		return nil, nil, "the module exports " + abi.ExportNoSnapshot, nil
	}
	if why := p.SnapshotBlocker(); why != "" {
		return nil, nil, why, nil
	}
	// A table's leading entries that no element fills are dropped, so
	// that no instance allocates them (4096 of them for a Go guest).
	if compacted, shift, err := p.CompactTable(); err == nil && compacted != nil {
		if q, err := wasmbin.Parse(compacted); err == nil {
			p, m.tableShift = q, shift
		}
	}
	data, err := p.ActiveData()
	if err != nil {
		return nil, nil, err.Error(), nil
	}
	derived, mutable, err := p.Freeze(wasmbin.FreezeOptions{ExportPrefix: snapGlobalPrefix, StartExport: snapStartExport, Strip: true})
	if err != nil {
		return nil, nil, err.Error(), nil
	}
	compiled, err := e.compile(ctx, m.name, derived)
	if err != nil {
		return nil, nil, "", err
	}
	snap, why := e.initTemplate(ctx, m, compiled, data, mutable, p.HasStart)
	if snap == nil {
		_ = compiled.Close(ctx)
		return nil, nil, why, nil
	}
	return compiled, snap, "", nil
}

// initTemplate instantiates the derived module once, initialises it as a
// fresh instance is initialised, and captures the result.
func (e *Engine) initTemplate(ctx context.Context, m *Module, compiled wazero.CompiledModule, data []wasmbin.DataSegment, mutable []int, hasStart bool) (*snapshot, string) {
	mc := e.guestConfig
	if m.wasi {
		w := &guestLogWriter{logger: e.cfg.logger, session: "(initialisation of module " + m.name + ")"}
		mc = mc.WithStdout(w).WithStderr(w)
	}
	c := &callContext{template: true}
	timeout := e.cfg.snapTime
	deadline := monotime.Since() + timeout
	who := fmt.Sprintf("module %q at load", m.name)
	// The template's memory is a mapping too, not Go memory: a module
	// may declare a large memory that it barely touches.
	blank, err := newMemImage(m.name, nil)
	if err != nil {
		return nil, "no memory for the initialisation: " + err.Error()
	}
	defer blank.drop()
	tmem := newSnapMemory(blank)
	defer tmem.release() // no device work runs at load
	var mod api.Module
	_, _, err = c.enter(withMemory(ctx, tmem), deadline, timeout, "instantiation", who, func(cc context.Context) error {
		var err error
		mod, err = e.runtimeOf(compiled).InstantiateModule(cc, compiled, mc)
		return err
	})
	if err != nil {
		if mod != nil {
			_ = mod.Close(context.Background())
		}
		return nil, err.Error()
	}
	defer mod.Close(context.Background())
	mem := mod.Memory()
	for i, d := range data {
		if !mem.Write(d.Offset, d.Bytes) {
			return nil, fmt.Sprintf("data segment %d does not fit its memory", i)
		}
	}
	steps := []string{}
	if hasStart {
		steps = append(steps, snapStartExport)
	}
	if m.hasInitialize {
		steps = append(steps, abi.ExportInitialize)
	}
	for _, name := range steps {
		f := mod.ExportedFunction(name)
		what := name
		if name == snapStartExport {
			what = "start function"
		}
		_, _, err := c.enter(ctx, deadline, timeout, what, who, func(cc context.Context) error {
			_, err := f.Call(cc)
			return err
		})
		if err != nil {
			var hc *errTemplateHostCall
			if errors.As(err, &hc) {
				return nil, hc.Error()
			}
			return nil, err.Error()
		}
	}
	snap := &snapshot{pages: mem.Size() >> 16}
	for _, i := range mutable {
		name := wasmbin.GlobalExportName(snapGlobalPrefix, i)
		g := mod.ExportedGlobal(name)
		if g == nil {
			return nil, "global " + name + " is not exported"
		}
		snap.globals = append(snap.globals, snapGlobal{export: name, value: g.Get()})
	}
	bytes, _ := mem.Read(0, mem.Size())
	img, err := newMemImage(m.name, bytes)
	if err != nil {
		return nil, "the snapshot's memory could not be stored: " + err.Error()
	}
	snap.img = img
	return snap, ""
}

// snapInstance is an instance made from a snapshot that no guest code has
// run in yet, and the writer its WASI output goes to.
type snapInstance struct {
	mod api.Module
	mem *snapMemory
	out *guestLogWriter // nil without WASI
}

// newSnapInstance makes an instance of m from its snapshot: its memory
// maps the snapshot's and its globals are set; its clocks and random
// source are the host's, as every instance's (guestConfig). It runs no guest code (the compiled module has no start
// function), so it needs no deadline.
func (m *Module) newSnapInstance(ctx context.Context) (*snapInstance, error) {
	snap := m.snap
	mc := m.engine.guestConfig
	si := &snapInstance{mem: newSnapMemory(snap.img)}
	if m.wasi {
		si.out = &guestLogWriter{logger: m.engine.cfg.logger}
		mc = mc.WithStdout(si.out).WithStderr(si.out)
	}
	mod, err := m.engine.runtimeOf(m.compiled).InstantiateModule(withMemory(ctx, si.mem), m.compiled, mc)
	if err == nil {
		err = applySnapshot(mod, snap)
	}
	if err != nil {
		if mod != nil {
			_ = mod.Close(context.Background())
		}
		si.mem.release() // no guest code ran: nothing on a device refers to it
		return nil, errdefs.Errorf(errdefs.ClassOf(err), "instantiation from the snapshot: %w", err)
	}
	si.mod = mod
	return si, nil
}

// spares keeps instances of a snapshotted module made ahead of time, so
// that a new session or a replacement takes one instead of instantiating
// (RATIONALE.md, "Warm spares"). A goroutine refills it after every take,
// up to its size; it starts with the first take, so a module that no
// session uses holds none.
type spares struct {
	m      *Module
	ready  chan *snapInstance
	wake   chan struct{}
	stop   chan struct{}
	once   sync.Once
	closed sync.Once
	done   sync.WaitGroup
}

func newSpares(m *Module, n int) *spares {
	return &spares{m: m, ready: make(chan *snapInstance, n), wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// take returns a spare instance, or one made now when none is ready.
func (p *spares) take(ctx context.Context) (*snapInstance, error) {
	p.once.Do(func() {
		p.done.Add(1)
		go p.refill()
	})
	var si *snapInstance
	select {
	case si = <-p.ready:
	default:
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if si != nil {
		return si, nil
	}
	return p.m.newSnapInstance(ctx)
}

func (p *spares) refill() {
	defer p.done.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
		for len(p.ready) < cap(p.ready) {
			si, err := p.m.newSnapInstance(context.Background())
			if err != nil {
				break // take makes its own, and reports the error
			}
			select {
			case p.ready <- si:
			case <-p.stop:
				si.close()
				return
			}
		}
	}
}

// close stops the refill and releases the spare instances. Later calls
// do nothing.
func (p *spares) close() {
	p.closed.Do(func() { close(p.stop) })
	p.done.Wait()
	for {
		select {
		case si := <-p.ready:
			si.close()
		default:
			return
		}
	}
}

// close closes an instance no guest code ran in, and releases its memory.
func (si *snapInstance) close() {
	_ = si.mod.Close(context.Background())
	si.mem.release()
}

// applySnapshot sizes a new instance's memory as the snapshot's and sets
// its globals. Its memory's contents already are the snapshot's.
func applySnapshot(mod api.Module, snap *snapshot) error {
	mem := mod.Memory()
	if cur := mem.Size() >> 16; cur < snap.pages {
		if _, ok := mem.Grow(snap.pages - cur); !ok {
			return errdefs.Errorf(errdefs.ErrOutOfBudget, "the snapshot's memory of %d pages cannot be mapped", snap.pages)
		}
	}
	for _, g := range snap.globals {
		mg, ok := mod.ExportedGlobal(g.export).(api.MutableGlobal)
		if !ok {
			return errdefs.Errorf(errdefs.ErrFault, "snapshot global %s is missing", g.export)
		}
		mg.Set(g.value)
	}
	return nil
}

func (m *Module) closeSnapshot() {
	if m.snap != nil {
		if m.spares != nil {
			m.spares.close()
		}
		m.snap.img.drop()
	}
}

// withMemory makes wazero take the memory of the instance instantiated
// with ctx from mem.
func withMemory(ctx context.Context, mem *snapMemory) context.Context {
	return experimental.WithMemoryAllocator(ctx, mem)
}
