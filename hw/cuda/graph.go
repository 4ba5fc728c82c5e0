package cuda

import (
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Graph is a fixed sequence of kernel launches captured once into a CUDA
// graph and replayed with a single cuGraphLaunch. The launches' arguments,
// buffer addresses included, are frozen at recording: the buffers must
// outlive the graph.
type Graph struct {
	dev      *Device
	exec     cuGraphExec
	kernels  int
	bufs     []*buffer    // every buffer the launches use
	inflight atomic.Int64 // queued launches not yet issued
	closed   atomic.Bool
}

type captureReq struct {
	launches []launch
	reply    chan captureResult
}

type captureResult struct {
	exec cuGraphExec
	err  error
}

// RecordGraph validates cmds like [Stream.Submit] and captures them, in
// order, into an executable graph on this stream's device. Recording runs
// on the stream's driver thread, in queue order, and does no device work.
// The graph refers to the commands' buffers: SubmitGraph fails with
// [errdefs.ErrClosed] once one of them is freed.
//
// # Errors
//
// [errdefs.ErrUnsupported] when the driver lacks the graph entry points; the
// errors of Submit, naming the command index.
func (s *Stream) RecordGraph(cmds []hw.Command) (*Graph, error) {
	if !s.dev.drv.HasGraphs() {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: the driver has no graph entry points", s.dev.name)
	}
	if len(cmds) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: empty graph")
	}
	req := &captureReq{launches: make([]launch, len(cmds)), reply: make(chan captureResult, 1)}
	var bufs []*buffer
	for i := range cmds {
		if err := s.dev.prepareLaunch(&cmds[i], &req.launches[i]); err != nil {
			return nil, errdefs.Errorf(errdefs.ClassOf(err), "cuda: graph command %d: %w", i, err)
		}
		// A fast gemm is recorded as the exact kernel (packed already):
		// a graph may be replayed on any stream, and cuBLAS's calls would
		// keep the recording stream's workspace.
		req.launches[i].blas = false
		for _, a := range cmds[i].Args {
			if b, ok := a.Buffer.(*buffer); ok {
				bufs = append(bufs, b)
			}
		}
	}
	o := op{kind: opCapture, capture: req}
	if _, err := s.enqueue(&o, s.dev.freeGen.Load(), nil, nil, nil); err != nil {
		return nil, err
	}
	var res captureResult
	select {
	case res = <-req.reply:
	case <-s.done:
		return nil, errdefs.Errorf(errdefs.ErrClosed, "cuda: %s: stream closed while recording", s.dev.name)
	}
	if res.err != nil {
		return nil, res.err
	}
	s.dev.live.Add(1)
	return &Graph{dev: s.dev, exec: res.exec, kernels: len(cmds), bufs: bufs}, nil
}

// capture runs on the driver thread.
func (s *Stream) capture(req *captureReq) captureResult {
	exec, err := s.captureLaunches(req.launches)
	return captureResult{exec: exec, err: err}
}

// captureLaunches records launches, in order, into an executable graph
// (driver thread). Nothing runs on the device.
func (s *Stream) captureLaunches(launches []launch) (cuGraphExec, error) {
	d := s.dev
	if err := d.Err(); err != nil {
		return 0, err
	}
	if err := d.check("cuStreamBeginCapture_v2", d.drv.StreamBeginCapture(s.cs, cuStreamCaptureModeThreadLo), errdefs.ErrRejected); err != nil {
		return 0, err
	}
	var firstErr error
	for i := range launches {
		r, call := s.issue(&launches[i])
		if r != cudaSuccess && firstErr == nil {
			firstErr = d.check(call+" (capture)", r, errdefs.ErrRejected)
		}
	}
	g, r := d.drv.StreamEndCapture(s.cs)
	if err := d.check("cuStreamEndCapture", r, errdefs.ErrRejected); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		if g != 0 {
			d.drv.GraphDestroy(g)
		}
		return 0, firstErr
	}
	exec, r := d.drv.GraphInstantiate(g)
	d.drv.GraphDestroy(g)
	if err := d.check("cuGraphInstantiateWithFlags", r, errdefs.ErrRejected); err != nil {
		return 0, err
	}
	return exec, nil
}

// execBatch issues a batch on the driver thread: one replay of its cached
// graph when there is one, else its launches one by one. It returns the
// first failing call's result and name.
func (s *Stream) execBatch(launches []launch) (cuResult, string) {
	d := s.dev
	if exec := s.graphFor(launches); exec != 0 {
		s.batchReplays.Add(1)
		return d.drv.GraphLaunch(exec, s.cs), "cuGraphLaunch (batch)"
	}
	s.batchDirect.Add(1)
	for i := range launches {
		if r, call := s.issue(&launches[i]); r != cudaSuccess {
			return r, call + " (batch)"
		}
	}
	return cudaSuccess, ""
}

// DefaultBatchGraphs is how many batch graphs each stream caches unless
// [Config.WithBatchGraphs] says otherwise.
const DefaultBatchGraphs = 16

// graphCache holds, per stream, the graphs of recently repeated batches
// (driver thread only). A batch is captured on its second sighting: a
// one-off batch costs no capture, a repeated one pays it once.
type graphCache struct {
	entries []*graphEntry
	clock   uint64
}

type graphEntry struct {
	key      uint64
	launches []launch // a private copy, compared in full on a key match
	exec     cuGraphExec
	seen     int
	failed   bool // capture failed: always launch directly
	used     uint64
}

// graphFor returns the cached graph for launches, capturing it when the
// batch is seen for the second time, or 0 to launch directly.
func (s *Stream) graphFor(launches []launch) cuGraphExec {
	d := s.dev
	limit := d.plat.cfg.batchGraphs
	if limit <= 0 || len(launches) < 2 || !d.drv.HasGraphs() || anyBLAS(launches) {
		return 0
	}
	c := &s.graphs
	c.clock++
	key := launchesKey(launches)
	for _, e := range c.entries {
		if e.key != key || !sameLaunches(e.launches, launches) {
			continue
		}
		e.used = c.clock
		e.seen++
		if e.exec == 0 && !e.failed {
			exec, err := s.captureLaunches(launches)
			if err != nil {
				e.failed = true
				return 0
			}
			e.exec = exec
			s.batchCapture.Add(1)
		}
		return e.exec
	}
	e := &graphEntry{key: key, launches: append([]launch(nil), launches...), seen: 1, used: c.clock}
	if len(c.entries) < limit {
		c.entries = append(c.entries, e)
		return 0
	}
	oldest := 0
	for i, x := range c.entries {
		if x.used < c.entries[oldest].used {
			oldest = i
		}
	}
	if x := c.entries[oldest]; x.exec != 0 && d.Err() == nil {
		// An instance still in flight is freed by the driver when done.
		d.drv.GraphExecDestroy(x.exec)
	}
	c.entries[oldest] = e
	return 0
}

// destroy releases every cached graph (driver thread, at teardown).
func (c *graphCache) destroy(d *Device, healthy bool) {
	for _, e := range c.entries {
		if e.exec != 0 && healthy {
			d.drv.GraphExecDestroy(e.exec)
		}
	}
	c.entries = nil
}

// anyBLAS reports a cuBLAS gemm among launches: such batches are issued
// call by call, never cached as graphs (a capture would fix cuBLAS's
// choices and workspace at capture time; each call re-binds them).
func anyBLAS(ls []launch) bool {
	for i := range ls {
		if ls[i].blas {
			return true
		}
	}
	return false
}

// launchesKey hashes launches (FNV-1a over every field that shapes them).
func launchesKey(ls []launch) uint64 {
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		h ^= v
		h *= 1099511628211
	}
	for i := range ls {
		l := &ls[i]
		mix(uint64(l.fn))
		mix(uint64(l.grid[0]) | uint64(l.grid[1])<<32)
		mix(uint64(l.grid[2]) | uint64(l.block[0])<<32)
		mix(uint64(l.block[1]) | uint64(l.block[2])<<32)
		mix(uint64(l.nparams))
		for _, p := range l.params[:l.nparams] {
			mix(p)
		}
	}
	return h
}

func sameLaunches(a, b []launch) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.blas != y.blas || x.dtype != y.dtype || x.fn != y.fn || x.grid != y.grid || x.block != y.block || x.nparams != y.nparams ||
			!slices.Equal(x.params[:x.nparams], y.params[:y.nparams]) {
			return false
		}
	}
	return true
}

// Kernels is how many launches the graph replays.
func (g *Graph) Kernels() int { return g.kernels }

// SubmitGraph enqueues one replay of g; its completion retires when every
// launch of the graph has.
func (s *Stream) SubmitGraph(g *Graph) (hw.Completion, error) {
	if g == nil || g.dev != s.dev {
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: graph of another device", s.dev.name)
	}
	g.inflight.Add(1)
	if g.closed.Load() {
		g.inflight.Add(-1)
		return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: graph is closed")
	}
	gen := s.dev.freeGen.Load()
	for _, b := range g.bufs {
		if b.isFreed() {
			g.inflight.Add(-1)
			return hw.Completion{}, errdefs.Errorf(errdefs.ErrClosed, "cuda: a buffer of the graph was freed")
		}
	}
	o := op{kind: opGraph, graph: g}
	c, err := s.enqueue(&o, gen, nil, g.bufs, nil)
	if err != nil {
		g.inflight.Add(-1)
	}
	return c, err
}

// Close destroys the executable graph. Replays already issued to the
// device finish first (the driver frees it asynchronously); replays still
// queued make Close return [errdefs.ErrBusy].
func (g *Graph) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: graph closed twice")
	}
	if g.inflight.Load() > 0 {
		g.closed.Store(false)
		return errdefs.Errorf(errdefs.ErrBusy, "cuda: graph has queued launches")
	}
	d := g.dev
	runtime.LockOSThread()
	if d.Err() == nil && d.drv.CtxSetCurrent(d.ctx) == cudaSuccess {
		d.drv.GraphExecDestroy(g.exec)
	}
	runtime.UnlockOSThread()
	d.live.Add(-1)
	return nil
}
