package cuda

import (
	"runtime"
	"sync/atomic"

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
// [hw.ErrClosed] once one of them is freed.
//
// # Errors
//
// [hw.ErrUnsupported] when the driver lacks the graph entry points; the
// errors of Submit, naming the command index.
func (s *Stream) RecordGraph(cmds []hw.Command) (*Graph, error) {
	if !s.dev.drv.HasGraphs() {
		return nil, hw.Errorf(hw.ErrUnsupported, "cuda: %s: the driver has no graph entry points", s.dev.name)
	}
	if len(cmds) == 0 {
		return nil, hw.Errorf(hw.ErrInvalidArgument, "cuda: empty graph")
	}
	req := &captureReq{launches: make([]launch, len(cmds)), reply: make(chan captureResult, 1)}
	var bufs []*buffer
	for i := range cmds {
		if err := s.dev.prepareLaunch(&cmds[i], &req.launches[i]); err != nil {
			return nil, hw.Errorf(hw.ClassOf(err), "cuda: graph command %d: %w", i, err)
		}
		for _, a := range cmds[i].Args {
			if b, ok := a.Buffer.(*buffer); ok {
				bufs = append(bufs, b)
			}
		}
	}
	o := op{kind: opCapture, capture: req}
	if _, err := s.enqueue(&o, s.dev.freeGen.Load(), nil, nil); err != nil {
		return nil, err
	}
	var res captureResult
	select {
	case res = <-req.reply:
	case <-s.done:
		return nil, hw.Errorf(hw.ErrClosed, "cuda: %s: stream closed while recording", s.dev.name)
	}
	if res.err != nil {
		return nil, res.err
	}
	s.dev.live.Add(1)
	return &Graph{dev: s.dev, exec: res.exec, kernels: len(cmds), bufs: bufs}, nil
}

// capture runs on the driver thread.
func (s *Stream) capture(req *captureReq) captureResult {
	d := s.dev
	if err := d.Err(); err != nil {
		return captureResult{err: err}
	}
	if err := d.check("cuStreamBeginCapture_v2", d.drv.StreamBeginCapture(s.cs, cuStreamCaptureModeThreadLo), hw.ErrRejected); err != nil {
		return captureResult{err: err}
	}
	var firstErr error
	for i := range req.launches {
		l := &req.launches[i]
		copy(s.pb.vals[:l.nparams], l.params[:l.nparams])
		r := d.drv.LaunchKernel(l.fn, l.grid, l.block, 0, s.cs, s.pb, l.nparams)
		runtime.KeepAlive(s.pb)
		if r != cudaSuccess && firstErr == nil {
			firstErr = d.check("cuLaunchKernel (capture)", r, hw.ErrRejected)
		}
	}
	g, r := d.drv.StreamEndCapture(s.cs)
	if err := d.check("cuStreamEndCapture", r, hw.ErrRejected); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		if g != 0 {
			d.drv.GraphDestroy(g)
		}
		return captureResult{err: firstErr}
	}
	exec, r := d.drv.GraphInstantiate(g)
	d.drv.GraphDestroy(g)
	if err := d.check("cuGraphInstantiateWithFlags", r, hw.ErrRejected); err != nil {
		return captureResult{err: err}
	}
	return captureResult{exec: exec}
}

// Kernels is how many launches the graph replays.
func (g *Graph) Kernels() int { return g.kernels }

// SubmitGraph enqueues one replay of g; its completion retires when every
// launch of the graph has.
func (s *Stream) SubmitGraph(g *Graph) (hw.Completion, error) {
	if g == nil || g.dev != s.dev {
		return hw.Completion{}, hw.Errorf(hw.ErrInvalidArgument, "cuda: %s: graph of another device", s.dev.name)
	}
	g.inflight.Add(1)
	if g.closed.Load() {
		g.inflight.Add(-1)
		return hw.Completion{}, hw.Errorf(hw.ErrClosed, "cuda: graph is closed")
	}
	gen := s.dev.freeGen.Load()
	for _, b := range g.bufs {
		if b.isFreed() {
			g.inflight.Add(-1)
			return hw.Completion{}, hw.Errorf(hw.ErrClosed, "cuda: a buffer of the graph was freed")
		}
	}
	o := op{kind: opGraph, graph: g}
	c, err := s.enqueue(&o, gen, nil, g.bufs)
	if err != nil {
		g.inflight.Add(-1)
	}
	return c, err
}

// Close destroys the executable graph. Replays already issued to the
// device finish first (the driver frees it asynchronously); replays still
// queued make Close return [hw.ErrBusy].
func (g *Graph) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return hw.Errorf(hw.ErrClosed, "cuda: graph closed twice")
	}
	if g.inflight.Load() > 0 {
		g.closed.Store(false)
		return hw.Errorf(hw.ErrBusy, "cuda: graph has queued launches")
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
