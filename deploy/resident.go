package deploy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/sessions"
	"github.com/stagehost/stagehost/sessions/exchange"
)

// Resident serves one [[resident]] table of the manifest
// ([manifest.Resident]): a template from which runs are started. Each run
// is a fresh startup line, payload, pair of streams and
// [sessions.ResidentSession]. It is not a [Pool]: it has no stage module,
// no instances and no queue.
type Resident struct {
	Spec *manifest.Resident
	d    *Deployment
	// epoch names this Resident's set of runs: random, made when the
	// deployment opened, so that run ids, which count from 1 in each
	// process, name one run only together with it.
	epoch string

	mu          sync.Mutex
	runs        []*ResidentRun // the last Spec.History runs, oldest first
	nextID      int
	running     int   // runs started and not yet finished
	quarantined []int // ids of the quarantined runs: they keep their resources forever
	wg          sync.WaitGroup
}

// ResidentRun is one run of a resident session.
type ResidentRun struct {
	ID       int           `json:"id"`
	State    string        `json:"state"` // starting, running, verified, failed, quarantined
	Error    string        `json:"error,omitempty"`
	Rounds   int           `json:"rounds"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Verified bool          `json:"verified"`
	done     chan struct{}
}

// ResidentStatus is a resident session's state: the body of GET
// /v1/residents/{name}, whether this process has the resident or another
// host of its lattice answered for it. Its fields are in the order of
// their JSON keys.
type ResidentStatus struct {
	// Epoch names the set of runs Runs belongs to: a new one in each
	// process that has the resident (a restarted worker, another host
	// of a lattice). A run is its Epoch and its ID.
	Epoch          string `json:"epoch"`
	History        int    `json:"history"`
	MaxQuarantined int    `json:"max_quarantined"`
	MaxRuns        int    `json:"max_runs"`
	// Quarantined holds the ids of every quarantined run, oldest first,
	// also those History dropped from Runs.
	Quarantined []int         `json:"quarantined"`
	Resident    string        `json:"resident"`
	Rounds      int           `json:"rounds"`
	Running     int           `json:"running"`
	Runs        []ResidentRun `json:"runs"` // the last History runs, oldest first
}

// ResidentStart is the answer to a start of a resident run: the body of
// POST /v1/residents/{name}/start, here or through the lattice. State is
// "running": the run joins and verifies in the background.
type ResidentStart struct {
	Epoch    string `json:"epoch"` // as ResidentStatus.Epoch: the run is this epoch's run ID
	ID       int    `json:"id"`
	Resident string `json:"resident"`
	State    string `json:"state"`
}

// Status returns the resident's state: its limits, and its runs as of
// now, in one snapshot.
func (r *Resident) Status() ResidentStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	runs := make([]ResidentRun, len(r.runs))
	for i, run := range r.runs {
		runs[i] = *run
	}
	return ResidentStatus{Epoch: r.epoch, History: r.Spec.History, MaxQuarantined: r.Spec.MaxQuarantined, MaxRuns: r.Spec.MaxRuns,
		Quarantined: append([]int{}, r.quarantined...), Resident: r.Spec.Name, Rounds: r.Spec.Rounds,
		Running: r.running, Runs: runs}
}

// StartRun starts a run as [Resident.Start] does, and returns the
// answer to the start.
func (r *Resident) StartRun(ctx context.Context) (ResidentStart, error) {
	run, err := r.Start(ctx)
	if err != nil {
		return ResidentStart{}, err
	}
	return ResidentStart{Epoch: r.epoch, ID: run.ID, Resident: r.Spec.Name, State: "running"}, nil
}

// Running returns how many runs are started and not yet finished.
func (r *Resident) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Quarantined returns the ids of the resident's quarantined runs, oldest
// first. Each keeps its startup line, payload, streams and budget charge
// for the life of the process (see [sessions.ResidentSession.Close]);
// once Spec.MaxQuarantined of them exist, Start refuses.
func (r *Resident) Quarantined() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int{}, r.quarantined...)
}

// Runs returns a snapshot of the resident's runs, oldest first: the last
// Spec.History of them.
func (r *Resident) Runs() []ResidentRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ResidentRun, len(r.runs))
	for i, run := range r.runs {
		out[i] = *run
	}
	return out
}

func (r *Resident) set(run *ResidentRun, f func(*ResidentRun)) {
	r.mu.Lock()
	f(run)
	r.mu.Unlock()
}

// Start starts a run: it is admitted, submits both participants and
// publishes RUN within the startup deadline, then joins them in the
// background under the join deadline, verifies the payload and closes the
// session. It returns once RUN (or ABORT) is published.
//
// Admission, in this order, all before anything is allocated:
//
//   - at most Spec.MaxRuns runs of this resident at once;
//   - fewer than Spec.MaxQuarantined quarantined runs of this resident
//     (each keeps its resources for good);
//   - a parked slot on the GPU device: at most its max_parked resident GPU
//     participants at once, over every resident, quarantined runs whose
//     GPU participant never retired included;
//   - one unit of the runtime's capacity ([host.Runtime.Reserve]), FIFO
//     with every stage and submission, held until the run ends (also when
//     it ends quarantined: the quarantine cap bounds those), waited for
//     within the startup deadline.
//
// On a cuda GPU the run's GPU stream comes from the device's pool of
// streams made before any resident kernel parked there (see
// [Resident] and RATIONALE.md), so a start never calls cuStreamCreate
// while resident kernels are parked.
//
// # Errors
//
//   - [errdefs.ErrBusy] when Spec.MaxRuns runs are already running, when the
//     GPU's max_parked participants are parked, or when the runtime's
//     capacity cannot be had within the startup deadline (no run is
//     started).
//   - [errdefs.ErrDeviceLost] when Spec.MaxQuarantined runs are quarantined.
//   - [errdefs.ErrUnsupported] for a resident whose two devices are not both
//     sim devices or both cuda devices (a cuda GPU and the cuda host
//     device, engine "cpu"), or whose payload is not the exchange's.
//   - Errors of the devices.
func (r *Resident) Start(ctx context.Context) (*ResidentRun, error) {
	r.mu.Lock()
	if r.Spec.MaxRuns > 0 && r.running >= r.Spec.MaxRuns {
		r.mu.Unlock()
		return &ResidentRun{State: "refused", Rounds: r.Spec.Rounds},
			errdefs.Errorf(errdefs.ErrBusy, "resident %q already has its max_runs of %d runs running; retry when one finishes", r.Spec.Name, r.Spec.MaxRuns)
	}
	if q := len(r.quarantined); r.Spec.MaxQuarantined > 0 && q >= r.Spec.MaxQuarantined {
		r.mu.Unlock()
		return &ResidentRun{State: "refused", Rounds: r.Spec.Rounds},
			errdefs.Errorf(errdefs.ErrDeviceLost, "resident %q: %d quarantined runs keep their resources; the cap is %d (max_quarantined): restart the process to free them", r.Spec.Name, q, r.Spec.MaxQuarantined)
	}
	r.running++
	r.mu.Unlock()
	slots, err := r.d.gpuSlots(r.Spec.GPU)
	if err == nil {
		err = slots.take(r.Spec.Name)
	}
	if err != nil {
		r.set(nil, func(*ResidentRun) { r.running-- })
		return &ResidentRun{State: "refused", Rounds: r.Spec.Rounds}, err
	}
	r.mu.Lock()
	r.nextID++
	run := &ResidentRun{ID: r.nextID, State: "starting", Rounds: r.Spec.Rounds, Started: time.Now(), done: make(chan struct{})}
	r.runs = append(r.runs, run)
	if h := r.Spec.History; h > 0 && len(r.runs) > h {
		r.runs = append(r.runs[:0:0], r.runs[len(r.runs)-h:]...)
	}
	r.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, r.Spec.StartupDeadline)
	defer cancel()
	l := &liveRun{slots: slots}
	if l.admission, err = r.d.Runtime.Reserve(sctx, host.Op{Owner: residentOwnerName(r.Spec.Name, run.ID), Device: r.Spec.GPU}); err != nil {
		if errors.Is(err, errdefs.ErrDeadlineExceeded) {
			err = errdefs.Errorf(errdefs.ErrBusy, "resident %q: not admitted within its startup deadline %v: the runtime's capacity of %d is in use; retry later", r.Spec.Name, r.Spec.StartupDeadline, r.d.Runtime.Capacity())
		}
		r.end(run, l, nil, err)
		return run, err
	}
	rs, payload, err := r.launch(sctx, run, l)
	if err != nil {
		r.end(run, l, rs, err)
		return run, err
	}
	r.set(run, func(run *ResidentRun) { run.State = "running" })
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.finish(run, l, rs, payload)
	}()
	return run, nil
}

// liveRun is what a run holds while it lives: its capacity, its parked
// slot and its pooled GPU stream.
type liveRun struct {
	admission *host.Reservation
	slots     *gpuSlots
	gpuStream hw.Stream // from the slots' pool; nil until taken
}

// end closes a run that failed to start (rs may be nil) and records it.
func (r *Resident) end(run *ResidentRun, l *liveRun, rs *sessions.ResidentSession, err error) {
	quarantined := false
	if rs != nil {
		cerr := rs.Close()
		if rs.Quarantined() {
			quarantined = true
			err = fmt.Errorf("%w (then %v)", err, cerr)
		}
	}
	r.release(l, rs)
	r.set(run, func(run *ResidentRun) {
		r.running--
		run.Duration = time.Since(run.Started)
		run.State, run.Error = "failed", err.Error()
		if quarantined {
			run.State = "quarantined"
			r.quarantined = append(r.quarantined, run.ID)
		}
	})
	close(run.done)
}

// release gives back what a run held once its session is closed: its
// capacity always; its parked slot and its GPU stream unless the session
// is quarantined with a GPU participant that never retired (that kernel
// may still be parked on the GPU, on that stream).
func (r *Resident) release(l *liveRun, rs *sessions.ResidentSession) {
	if l.admission != nil {
		l.admission.Release()
	}
	gpuRetired := true
	if rs != nil {
		gpuRetired, _ = rs.Retired()
	}
	if !gpuRetired {
		return // the slot and the stream stay with the quarantined run
	}
	l.slots.give(l.gpuStream)
}

// Run starts a run and waits for it to finish.
func (r *Resident) Run(ctx context.Context) (ResidentRun, error) {
	run, err := r.Start(ctx)
	if err != nil {
		return *run, err
	}
	select {
	case <-run.done:
	case <-ctx.Done():
		return *run, errdefs.ContextError(ctx, "waiting for resident run")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if run.State != "verified" {
		return *run, errdefs.Errorf(errdefs.ErrFault, "resident %q run %d: %s: %s", r.Spec.Name, run.ID, run.State, run.Error)
	}
	return *run, nil
}

func (r *Resident) launch(ctx context.Context, run *ResidentRun, l *liveRun) (*sessions.ResidentSession, hw.Shared, error) {
	d, spec := r.d, r.Spec
	gb, nb := d.Manifest.Device(spec.GPU).Backend, d.Manifest.Device(spec.NPU).Backend
	if gb != nb || (gb != manifest.BackendSim && gb != manifest.BackendCUDA) {
		return nil, nil, errdefs.Errorf(errdefs.ErrUnsupported, "resident %q: gpu %q (%s) and npu %q (%s) must both be sim or both cuda devices", spec.Name, spec.GPU, gb, spec.NPU, nb)
	}
	if spec.Payload != exchange.PayloadSize {
		return nil, nil, errdefs.Errorf(errdefs.ErrUnsupported, "resident %q: the resident participants exchange exactly %d payload bytes, the manifest asks for %d", spec.Name, exchange.PayloadSize, spec.Payload)
	}
	gpu, npu := d.devices[spec.GPU], d.devices[spec.NPU]
	var p hw.Platform = d.simP
	if gb == manifest.BackendCUDA {
		if npu != hw.Device(d.cudaP.Host()) {
			return nil, nil, errdefs.Errorf(errdefs.ErrUnsupported, "resident %q: on cuda the npu must be the host device (engine \"cpu\"), not %q", spec.Name, spec.NPU)
		}
		p = d.cudaP
	}
	// Closing the owner after a failure gets a deadline of its own: ctx's
	// (the startup deadline) may have passed, and would fail even an idle
	// stream's close.
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(spec.JoinDeadline, time.Second))
	defer cancel()
	owner := host.NewOwner(residentOwnerName(spec.Name, run.ID), hw.NewBudget(spec.Name, spec.Budget))
	startup, err := sessions.NewResidentStartup(p, gpu, npu, owner.Budget())
	if err != nil {
		return nil, nil, err
	}
	gs, err := l.slots.stream()
	if err != nil {
		_ = startup.Close()
		return nil, nil, err
	}
	l.gpuStream = gs // not the owner's: it goes back to the pool (see release)
	ns, err := owner.NewStream(npu)
	if err != nil {
		_ = startup.Close()
		return nil, nil, err
	}
	var gp, np sessions.Participant
	var payload hw.Shared
	if gb == manifest.BackendCUDA {
		gp, np, payload, err = exchange.NewCUDAExchange(d.cudaP, startup, gs, ns, spec.Rounds, owner)
	} else {
		gp, np, payload, err = exchange.NewSimExchange(p, startup, gs, ns, spec.Rounds, owner)
	}
	if err != nil {
		_ = startup.Close()
		_ = owner.Close(closeCtx)
		return nil, nil, err
	}
	rs, err := sessions.NewResidentSession(startup, gp, np,
		sessions.NewResidentConfig().WithRuntime(d.Runtime).WithOwner(owner).
			WithName(owner.Name()).WithCloseTimeout(spec.JoinDeadline))
	if err != nil {
		_ = startup.Close()
		_ = owner.Close(closeCtx)
		return nil, nil, err
	}
	if err := rs.SubmitGPU(); err != nil {
		return rs, nil, err
	}
	if err := rs.SubmitNPU(); err != nil {
		return rs, nil, err
	}
	if ctx.Err() != nil { // the startup deadline (Start's context)
		_ = rs.Abort()
		return rs, nil, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "resident %q: participants not accepted within the startup deadline %v", spec.Name, spec.StartupDeadline)
	}
	if err := rs.Start(); err != nil {
		return rs, nil, err
	}
	return rs, payload, nil
}

func (r *Resident) finish(run *ResidentRun, l *liveRun, rs *sessions.ResidentSession, payload hw.Shared) {
	defer close(run.done)
	retired, err := rs.WaitTimeout(r.Spec.JoinDeadline)
	verified := false
	if err == nil && retired {
		got, derr := exchange.ExchangeData(payload)
		want := exchange.ExpectedPayload(r.Spec.Rounds)
		verified = derr == nil && equalFloats(got, want)
		if !verified {
			err = errdefs.Errorf(errdefs.ErrFault, "payload after %d rounds does not match the expected exchange", r.Spec.Rounds)
		}
	} else if err == nil {
		err = errdefs.Errorf(errdefs.ErrDeadlineExceeded, "participants did not retire within the join deadline %v", r.Spec.JoinDeadline)
	}
	cerr := rs.Close()
	r.release(l, rs)
	r.set(run, func(run *ResidentRun) {
		r.running--
		run.Duration = time.Since(run.Started)
		run.Verified = verified
		switch {
		case rs.Quarantined():
			run.State = "quarantined"
			run.Error = fmt.Sprint(cerr)
			r.quarantined = append(r.quarantined, run.ID)
		case err != nil:
			run.State, run.Error = "failed", err.Error()
		default:
			run.State = "verified"
		}
	})
}

func equalFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// cudaDeviceName is the CUDA platform's name for a cuda manifest device:
// "cuda<index>" for a GPU, the host device "host0" for engine "cpu".
func cudaDeviceName(md *manifest.Device) string {
	if md.Engine == hw.EngineCPU {
		return cuda.HostDeviceName
	}
	return fmt.Sprintf("cuda%d", md.Index)
}

// closeAll waits for background joins to finish, then closes the idle
// streams of its GPU's resident pool.
func (r *Resident) closeAll() {
	r.wg.Wait()
	if g, err := r.d.gpuSlots(r.Spec.GPU); err == nil {
		g.closePool()
	}
}
