package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

const defaultLibrary = "libcuda.so.1"

// DefaultQueueDepth is how many commands a stream buffers between its
// submitters and its driver thread; beyond it, Submit, Write and Read
// return [errdefs.ErrBusy] (as the simulator does).
const DefaultQueueDepth = 1024

// Config configures [Open]. It is immutable: every WithX method returns a
// modified copy, so a Config can be shared and reused. A zero Config means
// [NewConfig]'s defaults. A WithX method called on a zero value starts from
// those defaults.
//
//	p, err := cuda.Open(cuda.NewConfig().WithBLASLibrary("-"))
type Config struct {
	set         bool // made by NewConfig; false: the zero value
	library     string
	queueDepth  int
	batchGraphs int
	copyStaging int
	eagerEvents bool // record an event after every burst (as before flushDelay; benchmarks)
	// createTimeout bounds how long NewStream waits for cuStreamCreate.
	createTimeout time.Duration
	ptx           []byte  // module source; nil: the embedded kernels
	drv           driver  // tests: a fake driver instead of libcuda
	blasLibrary   string  // cuBLAS path; "": the default search
	noBLAS        bool    // WithBLASLibrary("-")
	blas          blasAPI // tests: a fake cuBLAS
}

// NewConfig returns the default configuration:
//
//   - the driver libcuda.so.1 (see [Config.WithLibrary]);
//   - cuBLAS found by the default search (see [Config.WithBLASLibrary]);
//   - queue depth [DefaultQueueDepth] (see [Config.WithQueueDepth]);
//   - stream creation bounded by [DefaultStreamCreateTimeout] (see
//     [Config.WithStreamCreateTimeout]);
//   - [DefaultBatchGraphs] cached graphs per stream (see
//     [Config.WithBatchGraphs]);
//   - staging rings of [DefaultCopyStaging] bytes (see
//     [Config.WithCopyStaging]).
func NewConfig() Config {
	return Config{set: true, library: defaultLibrary, queueDepth: DefaultQueueDepth, createTimeout: DefaultStreamCreateTimeout, batchGraphs: DefaultBatchGraphs, copyStaging: DefaultCopyStaging}
}

// orDefaults is c, or [NewConfig]'s defaults when c is the zero value, so
// that a WithX method called on a zero Config keeps the other defaults.
func (c Config) orDefaults() Config {
	if !c.set {
		return NewConfig()
	}
	return c
}

// WithLibrary loads the CUDA driver from path instead of "libcuda.so.1".
func (c Config) WithLibrary(path string) Config {
	c = c.orDefaults()
	c.library = path
	return c
}

// WithBLASLibrary loads cuBLAS, for the fast tier of gemm, from path
// instead of searching for libcublas.so.13 and libcublas.so.12 (the
// loader's search, LD_LIBRARY_PATH included, then the CUDA toolkit's
// directories). "-" disables cuBLAS: the fast programs run the exact
// kernels.
func (c Config) WithBLASLibrary(path string) Config {
	c = c.orDefaults()
	c.blasLibrary = path
	c.noBLAS = path == "-"
	return c
}

// withBLAS replaces cuBLAS (tests: a fake).
func (c Config) withBLAS(b blasAPI) Config {
	c = c.orDefaults()
	c.blas = b
	return c
}

// WithQueueDepth sets how many commands each stream buffers before Submit,
// Write and Read answer [errdefs.ErrBusy] (default [DefaultQueueDepth]; values
// below 1 mean 1).
func (c Config) WithQueueDepth(n int) Config {
	c = c.orDefaults()
	c.queueDepth = max(n, 1)
	return c
}

// DefaultStreamCreateTimeout is how long [Device.NewStream] waits for
// cuStreamCreate unless [Config.WithStreamCreateTimeout] says otherwise.
const DefaultStreamCreateTimeout = 5 * time.Second

// WithStreamCreateTimeout bounds how long [Device.NewStream] waits for
// the driver to create the stream (default [DefaultStreamCreateTimeout];
// values below 1ms mean 1ms). On the H200, cuStreamCreate never returned
// while 35 resident kernels, each launched right after its own stream was
// created, were parked on the device (docs/gpu.md): past the bound
// NewStream fails, while the OS thread that called the driver stays
// blocked in it (nothing can interrupt a driver call). If the call ever
// returns, that thread destroys the stream it got and exits.
func (c Config) WithStreamCreateTimeout(d time.Duration) Config {
	c = c.orDefaults()
	c.createTimeout = max(d, time.Millisecond)
	return c
}

// WithBatchGraphs sets how many CUDA graphs each stream caches for
// repeated batches ([Stream.SubmitBatch]; default [DefaultBatchGraphs]);
// 0 turns the cache off, so every batch is launched kernel by kernel.
func (c Config) WithBatchGraphs(n int) Config {
	c = c.orDefaults()
	c.batchGraphs = max(n, 0)
	return c
}

// withEagerEvents records each burst's event as soon as the queue runs
// empty, as before flushDelay existed (benchmarks compare the two).
func (c Config) withEagerEvents() Config {
	c = c.orDefaults()
	c.eagerEvents = true
	return c
}

// withPTX replaces the embedded module (tests: STAGEHOST_CUDA_PTX).
func (c Config) withPTX(src []byte) Config {
	c = c.orDefaults()
	c.ptx = src
	return c
}

// withDriver replaces libcuda (tests: the fake driver).
func (c Config) withDriver(d driver) Config {
	c = c.orDefaults()
	c.drv = d
	return c
}

// Platform is the set of CUDA devices of this process, one [Device] per
// GPU, named cuda0, cuda1, ... in driver order, plus the host device
// "host0" ([HostDevice], [hw.EngineCPU]) that stands in for an NPU. It
// implements [hw.Platform].
type Platform struct {
	drv     driver
	cfg     Config
	version int32
	devices []*Device
	host    *HostDevice
	pinned  pinnedRanges // page-locked host memory allocated through p
}

var _ hw.Platform = (*Platform)(nil)

// Open loads the CUDA driver, initializes it and opens every device,
// configured by cfg (a zero Config means [NewConfig]'s defaults): it
// retains each device's primary context and loads the kernel module into
// it eagerly (lazy loading can deadlock against a resident kernel).
//
// # Errors
//
// [errdefs.ErrUnsupported] when libcuda.so.1 cannot be loaded (the message
// carries dlopen's reason), lacks required symbols (all of them are named),
// cuInit fails, there is no device, or the driver rejects the kernels.
func Open(cfg Config) (*Platform, error) {
	if !cfg.set {
		cfg = NewConfig()
	}
	drv := cfg.drv
	if drv == nil {
		lib, err := openLibrary(cfg.library)
		if err != nil {
			return nil, err
		}
		drv = lib
	}
	if r := drv.Init(); r != cudaSuccess {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuInit: %s", resultString(drv, r))
	}
	p := &Platform{drv: drv, cfg: cfg}
	p.version, _ = drv.DriverGetVersion()
	n, r := drv.DeviceGetCount()
	if r != cudaSuccess {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuDeviceGetCount: %s", resultString(drv, r))
	}
	if n <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: no CUDA device")
	}
	src := cfg.ptx
	if src == nil {
		src = kernelsPTX
	}
	image := append(append(make([]byte, 0, len(src)+1), src...), 0)
	for i := range n {
		d, err := openDevice(p, int(i), image)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.devices = append(p.devices, d)
	}
	p.host = newHostDevice(p)
	return p, nil
}

// DriverVersion is cuDriverGetVersion's answer (for example 13000).
func (p *Platform) DriverVersion() int { return int(p.version) }

// Devices lists every GPU in driver order, then the host device.
func (p *Platform) Devices() []hw.Device {
	out := make([]hw.Device, len(p.devices), len(p.devices)+1)
	for i, d := range p.devices {
		out[i] = d
	}
	if p.host != nil {
		out = append(out, p.host)
	}
	return out
}

// Device returns a device by name ("cuda0", or "host0" for the host
// device), or an [errdefs.ErrNotFound] error.
func (p *Platform) Device(name string) (hw.Device, error) {
	for _, d := range p.devices {
		if d.name == name {
			return d, nil
		}
	}
	if p.host != nil && name == HostDeviceName {
		return p.host, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "cuda: no device %q", name)
}

// Host is the platform's host device, "host0".
func (p *Platform) Host() *HostDevice { return p.host }

// Close closes every device. Devices with live streams, buffers or shared
// allocations stay open and their errors are returned.
func (p *Platform) Close() error {
	var errs []error
	if p.host != nil {
		if err := p.host.Close(); err != nil && !errors.Is(err, errdefs.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, d := range p.devices {
		if err := d.Close(); err != nil && !errors.Is(err, errdefs.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Device is one CUDA GPU with its primary context and loaded kernels. It
// implements [hw.Device].
type Device struct {
	plat    *Platform
	drv     driver
	name    string
	model   string
	ordinal int
	dev     cuDevice
	ctx     cuContext
	mod     cuModule
	progs   map[string]*program

	lost     atomic.Pointer[error]
	lostOnce sync.Once
	lostCh   chan struct{} // closed when the device is lost

	resetResult cuResult // of cuDevicePrimaryCtxReset at Close after a loss

	live   atomic.Int64 // streams, buffers, graphs and shared allocations
	closed atomic.Bool

	streamsMu sync.Mutex
	streams   map[*Stream]struct{} // open streams
	freeGen   atomic.Uint64        // bumped by every Free

	blas deviceBLAS // the fast tier's cuBLAS handle (blas.go)

	limitsOnce sync.Once
	limits     hw.LaunchLimits // LaunchLimits, read once
	vendorMu   sync.Mutex
	vendorMods []cuModule // vendor kernels' modules (vendor.go), unloaded at Close
}

var _ hw.Device = (*Device)(nil)

func openDevice(p *Platform, ordinal int, image []byte) (*Device, error) {
	drv := p.drv
	dev, r := drv.DeviceGet(int32(ordinal))
	if r != cudaSuccess {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuDeviceGet(%d): %s", ordinal, resultString(drv, r))
	}
	model, _ := drv.DeviceGetName(dev)
	ctx, r := drv.DevicePrimaryCtxRetain(dev)
	if r != cudaSuccess {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuDevicePrimaryCtxRetain(%d): %s", ordinal, resultString(drv, r))
	}
	d := &Device{
		plat: p, drv: drv, name: fmt.Sprintf("cuda%d", ordinal), model: model,
		ordinal: ordinal, dev: dev, ctx: ctx, progs: make(map[string]*program, len(kernels)),
		lostCh: make(chan struct{}), streams: make(map[*Stream]struct{}),
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fail := func(err error) (*Device, error) {
		if d.mod != 0 {
			drv.ModuleUnload(d.mod)
		}
		drv.DevicePrimaryCtxRelease(dev)
		return nil, err
	}
	if r := drv.CtxSetCurrent(ctx); r != cudaSuccess {
		return fail(errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: cuCtxSetCurrent: %s", d.name, resultString(drv, r)))
	}
	mod, log, r := drv.ModuleLoadData(image)
	if r != cudaSuccess {
		if log != "" {
			log = "\n" + log
		}
		return fail(errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: cuModuleLoadDataEx(kernels): %s%s", d.name, resultString(drv, r), log))
	}
	d.mod = mod
	for _, k := range kernels {
		fn, r := drv.ModuleGetFunction(mod, k.ptxEntry())
		if r != cudaSuccess {
			return fail(errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: kernel %q: %s", d.name, k.name, resultString(drv, r)))
		}
		d.progs[k.name] = &program{dev: d, k: k, fn: fn}
	}
	return d, nil
}

// Name is "cuda<ordinal>".
func (d *Device) Name() string { return d.name }

// Engine is [hw.EngineGPU].
func (d *Device) Engine() hw.Engine { return hw.EngineGPU }

// Model is the driver's name for the GPU ("NVIDIA H200").
func (d *Device) Model() string { return d.model }

// Err is nil while the device is healthy, and the [errdefs.ErrDeviceLost] error
// naming the first sticky CUDA error once it is lost.
func (d *Device) Err() error {
	if p := d.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// usable returns the error that stops new work: closed or lost.
func (d *Device) usable() error {
	if d.closed.Load() {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s is closed", d.name)
	}
	return d.Err()
}

// markLost records the first loss cause and wakes every waiter. It returns
// the recorded (first) error.
func (d *Device) markLost(cause error) error {
	d.lostOnce.Do(func() {
		d.lost.Store(&cause)
		close(d.lostCh)
	})
	return *d.lost.Load()
}

// check turns a driver result into an error. A sticky result loses the
// device; out-of-memory is [errdefs.ErrOutOfBudget]; unsupported operations are
// [errdefs.ErrUnsupported]; everything else gets class.
func (d *Device) check(call string, r cuResult, class error) error {
	if r == cudaSuccess {
		return nil
	}
	if r.sticky() {
		return d.markLost(errdefs.Errorf(errdefs.ErrDeviceLost, "cuda: %s lost: %s failed with %s", d.name, call, resultString(d.drv, r)))
	}
	if err := d.Err(); err != nil {
		// After a loss, every call fails; report the loss, not the symptom.
		return err
	}
	switch r {
	case cudaErrorOutOfMemory:
		class = errdefs.ErrOutOfBudget
	case cudaErrorNotSupported, cudaErrorNotPermitted:
		class = errdefs.ErrUnsupported
	}
	return errdefs.Errorf(class, "cuda: %s: %s: %s", d.name, call, resultString(d.drv, r))
}

// enter makes the device's context current on this OS thread. The caller
// holds runtime.LockOSThread.
func (d *Device) enter() error {
	return d.check("cuCtxSetCurrent", d.drv.CtxSetCurrent(d.ctx), errdefs.ErrFault)
}

// Prepare returns the named kernel, or an [errdefs.ErrNotFound] error. The
// kernels are loaded at Open, so this does no driver work.
func (d *Device) Prepare(name string) (hw.Program, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	p, ok := d.progs[name]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "cuda: %s: no program %q", d.name, name)
	}
	if p.k.fastGemm() {
		d.fastBLAS() // load cuBLAS and create the handle now, not at the first Submit
	}
	return p, nil
}

// Close unloads the kernels and releases the primary context. Streams,
// buffers and shared allocations on the device must be closed or freed
// first ([errdefs.ErrBusy] otherwise). Closing twice returns [errdefs.ErrClosed].
func (d *Device) Close() error {
	if n := d.live.Load(); n > 0 {
		return errdefs.Errorf(errdefs.ErrBusy, "cuda: %s: %d stream(s) or allocation(s) still open", d.name, n)
	}
	if !d.closed.CompareAndSwap(false, true) {
		return errdefs.Errorf(errdefs.ErrClosed, "cuda: %s is already closed", d.name)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var err error
	if d.drv.CtxSetCurrent(d.ctx) == cudaSuccess {
		d.closeBLAS()
	}
	if d.drv.CtxSetCurrent(d.ctx) == cudaSuccess && d.mod != 0 {
		if r := d.drv.ModuleUnload(d.mod); r != cudaSuccess && d.Err() == nil {
			err = d.check("cuModuleUnload", r, errdefs.ErrFault)
		}
	}
	if d.drv.CtxSetCurrent(d.ctx) == cudaSuccess {
		d.vendorMu.Lock()
		for _, m := range d.vendorMods {
			d.drv.ModuleUnload(m)
		}
		d.vendorMods = nil
		d.vendorMu.Unlock()
	}
	d.drv.CtxSetCurrent(0)
	if r := d.drv.DevicePrimaryCtxRelease(d.dev); r != cudaSuccess && err == nil && d.Err() == nil {
		err = d.check("cuDevicePrimaryCtxRelease", r, errdefs.ErrFault)
	}
	if d.Err() != nil {
		// A sticky error poisons the primary context for the whole
		// process; resetting it lets a later Open start afresh. (Other
		// users of the context in this process have lost it already.)
		d.resetResult = d.drv.DevicePrimaryCtxReset(d.dev)
	}
	return err
}

// program is one kernel of the loaded module, bound to its device.
type program struct {
	dev *Device
	k   *kernel
	fn  cuFunction
	// vendor is a vendor kernel's declaration (PrepareVendor); nil for
	// the built-in kernels.
	vendor *hw.KernelInfo
}

func (p *program) Name() string      { return p.k.name }
func (p *program) Device() hw.Device { return p.dev }

// KernelInfo returns the kernel's description (every kernel has one).
func (p *program) KernelInfo() (hw.KernelInfo, bool) {
	if p.vendor != nil {
		return *p.vendor, true
	}
	return p.k.info(), true
}
