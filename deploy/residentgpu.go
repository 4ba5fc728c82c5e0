package deploy

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/manifest"
)

// gpuSlots is the resident state of one GPU device, shared by every
// resident that uses it: how many resident GPU participants are parked
// there, bounded by the device's max_parked, and a pool of streams for
// them.
//
// On a cuda GPU the pool is filled with max_parked streams when the first
// resident run takes a slot, that is before any resident kernel parks
// there: on the H200 a cuStreamCreate made while 35 resident kernels were
// parked never returned, when each had created its own stream just before
// parking (docs/gpu.md), and creation slows from 0.1 ms to 20–34 ms while
// kernels are parked. A run takes a stream from the pool and gives it back
// when it ends; a run quarantined with its kernel unretired keeps both its
// slot and its stream, so the pool never needs more than max_parked
// streams. Only when the fill fell short (a creation failed) and no
// resident kernel is parked does a run create a stream itself. On sim the
// pool fills on demand (sim streams do not have the hazard).
type gpuSlots struct {
	dev     hw.Device
	limit   int
	prefill bool

	mu      sync.Mutex
	parked  int         // slots taken: runs between admission and their GPU participant's retirement
	pool    []hw.Stream // idle streams for resident GPU participants
	filled  bool        // the cuda pool was filled
	created int         // streams made for the pool, ever
}

var (
	gpuSlotsMu    sync.Mutex
	gpuSlotsByDev = map[hw.Device]*gpuSlots{}
)

// gpuSlots returns the resident state of the GPU device named name.
func (d *Deployment) gpuSlots(name string) (*gpuSlots, error) {
	dev := d.devices[name]
	md := d.Manifest.Device(name)
	if dev == nil || md == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no device %q", name)
	}
	gpuSlotsMu.Lock()
	defer gpuSlotsMu.Unlock()
	g := gpuSlotsByDev[dev]
	if g == nil {
		limit := md.MaxParked
		if limit <= 0 {
			limit = 32
		}
		g = &gpuSlots{dev: dev, limit: limit, prefill: md.Backend == manifest.BackendCUDA}
		gpuSlotsByDev[dev] = g
	}
	return g, nil
}

// take takes a parked slot for one run of resident, filling a cuda pool
// first if nothing is parked yet.
func (g *gpuSlots) take(resident string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.parked >= g.limit {
		return errdefs.Errorf(errdefs.ErrBusy, "resident %q: %d resident GPU participants are parked on %q, its max_parked (quarantined runs whose kernel never retired included); retry when one retires",
			resident, g.parked, g.dev.Name())
	}
	if g.prefill && !g.filled && g.parked == 0 {
		var err error
		for len(g.pool) < g.limit {
			var s hw.Stream
			if s, err = g.dev.NewStream(); err != nil {
				break
			}
			g.pool = append(g.pool, s)
			g.created++
		}
		if len(g.pool) == 0 && err != nil {
			return err // try the fill again at the next start
		}
		g.filled = true
	}
	g.parked++
	return nil
}

// stream hands a run (which holds a slot) an idle stream.
func (g *gpuSlots) stream() (hw.Stream, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := len(g.pool); n > 0 {
		s := g.pool[n-1]
		g.pool = g.pool[:n-1]
		return s, nil
	}
	if g.prefill && g.parked > 1 {
		return nil, errdefs.Errorf(errdefs.ErrBusy, "%q has no pre-created resident stream left and %d other resident runs hold slots: creating a stream while resident kernels are parked can hang the driver; retry when one ends",
			g.dev.Name(), g.parked-1)
	}
	s, err := g.dev.NewStream()
	if err == nil {
		g.created++
	}
	return s, err
}

// give returns a slot, and s (nil: none was taken) to the pool if it is
// idle; a stream still busy is never handed to another run.
func (g *gpuSlots) give(s hw.Stream) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.parked--
	if s != nil && s.Idle() {
		g.pool = append(g.pool, s)
	}
}

// counts returns the slots taken and the pool's size.
func (g *gpuSlots) counts() (parked, pooled, created int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.parked, len(g.pool), g.created
}

// closePool closes the pool's idle streams (the deployment is closing).
func (g *gpuSlots) closePool() {
	g.mu.Lock()
	pool := g.pool
	g.pool = nil
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range pool {
		_ = s.Close(ctx)
	}
	gpuSlotsMu.Lock()
	if gpuSlotsByDev[g.dev] == g {
		g.mu.Lock()
		if g.parked == 0 {
			delete(gpuSlotsByDev, g.dev)
		}
		g.mu.Unlock()
	}
	gpuSlotsMu.Unlock()
}

// residentCollector exports, per resident, its runs started, running,
// retained by state and quarantined, and the parked resident GPU
// participants per device.
type residentCollector struct{ d *Deployment }

// ResidentCollector is the Prometheus collector of d's resident sessions'
// runs (residentCollector).
func (d *Deployment) ResidentCollector() prometheus.Collector { return residentCollector{d} }

// residentRunStates are the states a resident run is in (ResidentRun.State).
var residentRunStates = []string{"starting", "running", "verified", "failed", "quarantined"}

var (
	residentRunsStarted = prometheus.NewDesc("stagehost_resident_runs_started_total",
		"Runs of the resident started since the service started (a start refused at admission is not a run).", []string{"resident"}, nil)
	residentRunsByState = prometheus.NewDesc("stagehost_resident_runs",
		"Runs of the resident in its retained history (the last `history` runs; GET /v1/residents/{name}) by state: starting, running, verified, failed, quarantined.",
		[]string{"resident", "state"}, nil)
	residentRunning = prometheus.NewDesc("stagehost_resident_running",
		"Runs of the resident started and not yet finished.", []string{"resident"}, nil)
	residentQuarantined = prometheus.NewDesc("stagehost_resident_quarantined_runs",
		"Quarantined runs of the resident: each keeps its startup line, payload and streams for the life of the process; at max_quarantined, starts are refused.", []string{"resident"}, nil)
	residentParked = prometheus.NewDesc("stagehost_resident_parked",
		"Resident GPU participants holding a parked slot on the device (at most its max_parked), quarantined ones whose kernel never retired included.", []string{"device"}, nil)
)

func (c residentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- residentRunsStarted
	ch <- residentRunsByState
	ch <- residentRunning
	ch <- residentQuarantined
	ch <- residentParked
}

func (c residentCollector) Collect(ch chan<- prometheus.Metric) {
	gpus := map[string]bool{}
	for _, name := range c.d.ResidentNames() {
		r := c.d.Resident(name)
		r.mu.Lock()
		started := r.nextID // run ids count from 1 in start order
		r.mu.Unlock()
		byState := make(map[string]int, len(residentRunStates))
		for _, run := range r.Runs() {
			byState[run.State]++
		}
		ch <- prometheus.MustNewConstMetric(residentRunsStarted, prometheus.CounterValue, float64(started), name)
		for _, st := range residentRunStates {
			ch <- prometheus.MustNewConstMetric(residentRunsByState, prometheus.GaugeValue, float64(byState[st]), name, st)
		}
		ch <- prometheus.MustNewConstMetric(residentRunning, prometheus.GaugeValue, float64(r.Running()), name)
		ch <- prometheus.MustNewConstMetric(residentQuarantined, prometheus.GaugeValue, float64(len(r.Quarantined())), name)
		gpus[r.Spec.GPU] = true
	}
	for name := range gpus {
		dev := c.d.devices[name]
		gpuSlotsMu.Lock()
		g := gpuSlotsByDev[dev]
		gpuSlotsMu.Unlock()
		parked := 0
		if g != nil {
			parked, _, _ = g.counts()
		}
		ch <- prometheus.MustNewConstMetric(residentParked, prometheus.GaugeValue, float64(parked), name)
	}
}
