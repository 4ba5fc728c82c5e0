package deploy

import (
	"context"
	"fmt"
	"sync"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// loadKernels compiles the Wasm module of every [[kernel]] that a
// session on one of the deployment's sim devices lists, reading its file
// again and checking its sha256 once more. A session on a cuda GPU that
// lists a vendor kernel is refused: vendor PTX runs only in a worker
// process of its tenant (serve --supervise), never in this process,
// where a fault or a hang of the kernel would take every session down
// (docs/security.md).
func (d *Deployment) loadKernels(ctx context.Context) error {
	m := d.Manifest
	for _, s := range m.Sessions {
		for _, name := range s.Programs {
			k := m.KernelNamed(name)
			if k == nil {
				continue
			}
			for _, devName := range s.Devices {
				dev, ok := d.devices[devName]
				if !ok {
					continue // another worker's device
				}
				if dev.Engine() == hw.EngineGPU && m.Device(devName).Backend == manifest.BackendCUDA {
					continue // PTX: vendorPrograms, in the tenant's worker
				}
				if _, done := d.kernels[name]; done {
					continue
				}
				wk, err := d.loadKernel(ctx, k)
				if err != nil {
					return fmt.Errorf("session %q: %w", s.Name, err)
				}
				if d.kernels == nil {
					d.kernels = map[string]*stages.WasmKernel{}
				}
				d.kernels[name] = wk
			}
		}
	}
	return nil
}

func (d *Deployment) loadKernel(ctx context.Context, k *manifest.Kernel) (*stages.WasmKernel, error) {
	bin, err := manifest.ReadFile(k.WasmFile, d.Manifest.Runtime.MaxModuleSize)
	if err != nil {
		return nil, fmt.Errorf("kernel %q: %w", k.Name, err)
	}
	if got := stages.SHA256(bin); got != k.WasmSHA256 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: %q changed since the manifest was read: it hashes to %s, not %s", k.Name, k.WasmFile, got, k.WasmSHA256)
	}
	return d.Engine.LoadKernel(ctx, bin, k.Spec(), stages.NewKernelConfig())
}

// sessionKernels are the vendor kernels a session lists.
func (d *Deployment) sessionKernels(s *manifest.Session) []*stages.WasmKernel {
	var ks []*stages.WasmKernel
	for _, name := range s.Programs {
		if k, ok := d.kernels[name]; ok {
			ks = append(ks, k)
		}
	}
	return ks
}

// refuseVendorPTX refuses a session on a cuda GPU of the deployment
// (every device, or only device when it is not "") that lists a vendor
// kernel, before any device is opened.
// A worker of the session's tenant (Config.WithTenant with its name)
// runs it instead.
func refuseVendorPTX(m *manifest.Manifest, device, tenant string, byTenant bool) error {
	for _, s := range m.Sessions {
		if byTenant && s.TenantName() != tenant {
			continue // another worker's session
		}
		if byTenant && tenant != "" {
			continue // this is the tenant's own worker
		}
		for _, name := range s.Programs {
			if m.KernelNamed(name) == nil {
				continue
			}
			for _, devName := range s.Devices {
				md := m.Device(devName)
				if md == nil || (device != "" && devName != device) {
					continue
				}
				if md.Backend == manifest.BackendCUDA && md.Engine == hw.EngineGPU {
					return errdefs.Errorf(errdefs.ErrUnsupported, "session %q: vendor PTX kernel %q runs only in a worker process of its tenant: start with serve --supervise", s.Name, name)
				}
			}
		}
	}
	return nil
}

// vendorPrograms gives a session on a cuda GPU, in its tenant's worker,
// the vendor PTX kernels it lists: each compiled to a cubin by a child
// process under the kernel's jit_timeout (cached by the PTX's sha256, the
// compute capability and the driver version in the deployment's cache
// directory), then loaded and checked against its declaration on the
// session's device. The deployment's vendor cache (d.vendor) does each
// step once per kernel: the first instance that lists a kernel reads its
// PTX and checks it against the manifest's sha256, compiles it and loads
// it; every later instance (of any session, and those a swap, a reload or
// a reset makes) uses those bytes, that cubin and that program.
func (d *Deployment) vendorPrograms(ctx context.Context, ms *manifest.Session, dev hw.Device, cfg stages.SessionConfig) (stages.SessionConfig, error) {
	cd, ok := dev.(*cuda.Device)
	if !ok || d.cudaP == nil {
		return cfg, nil
	}
	for _, name := range ms.Programs {
		k := d.Manifest.KernelNamed(name)
		if k == nil {
			continue
		}
		if k.PTXFile == "" {
			return cfg, errdefs.Errorf(errdefs.ErrInvalidArgument, "session %q: vendor kernel %q has no ptx for cuda device %q", ms.Name, name, dev.Name())
		}
		e, err := d.vendor.get(ctx, k, d.Manifest.Runtime.MaxModuleSize)
		if err != nil {
			return cfg, err
		}
		cubin, err := e.cubin(ctx, cd.ComputeCapability(), func(ptx []byte) ([]byte, error) {
			cubin, _, err := cuda.CompilePTX(ctx, cuda.JITConfig{
				CacheDir:          cacheDirOf(d.Manifest),
				Timeout:           k.JITTimeout,
				ComputeCapability: cd.ComputeCapability(),
				DriverVersion:     int32(d.cudaP.DriverVersion()),
			}, k.Name, ptx)
			return cubin, err
		})
		if err != nil {
			return cfg, fmt.Errorf("session %q: %w", ms.Name, err)
		}
		info := hw.KernelInfo{Name: k.Name, Args: k.Spec().Args}
		file, entry, lim := k.PTXFile, k.Entry, k.VendorLimits()
		cfg = cfg.WithVendorProgram(info, func(hd hw.Device) (hw.Program, error) {
			c, ok := hd.(*cuda.Device)
			if !ok {
				return nil, errdefs.Errorf(errdefs.ErrUnsupported, "vendor kernel %q: device %q is not a cuda GPU", info.Name, hd.Name())
			}
			if err := c.Err(); err != nil {
				return nil, err // lost: not even a loaded program serves
			}
			return e.program(hd, func() (hw.Program, error) { return c.PrepareVendorLimits(cubin, file, entry, info, lim) })
		})
	}
	return cfg, nil
}

// vendorCache is what a deployment made of its vendor PTX kernels, kept
// for the deployment's life: for each kernel, keyed by its name and the
// PTX's sha256 as the manifest pins them, the PTX bytes read and checked
// once, the cubin compiled once per compute capability and the program
// loaded once per device. The zero value is ready. It is safe for
// concurrent use: the first caller of a kernel does the work while the
// others wait for it (or for their context); an error is not kept, so the
// next caller tries again. close drops everything; a later get is
// refused.
type vendorCache struct {
	// read reads a PTX file; nil is manifest.ReadFile. (Tests count reads
	// through it.)
	read func(path string, limit int64) ([]byte, error)

	mu      sync.Mutex
	closed  bool
	entries map[vendorKey]*vendorEntry
}

type vendorKey struct{ name, sha256 string }

// vendorEntry is one kernel's PTX, cubins and programs.
type vendorEntry struct {
	c   *vendorCache
	k   *manifest.Kernel
	sem chan struct{} // held (capacity 1) while the entry reads, compiles or loads

	ptx    []byte                   // nil until read and checked
	cubins map[string][]byte        // by compute capability
	progs  map[hw.Device]hw.Program // by device
}

// get returns k's entry with its PTX read from k.PTXFile (at most limit
// bytes) and checked against k.PTXSHA256 on the first call for the
// kernel; later calls return the same bytes without reading the file.
//
// # Errors
//
//   - [errdefs.ErrClosed]: the cache was closed (the deployment is
//     closing).
//   - [errdefs.ErrInvalidArgument]: the file's bytes do not hash to the
//     manifest's sha256, naming the kernel and the file.
//   - the reader's error (the file is missing, too large, …), naming the
//     kernel; or ctx's error while another caller reads or compiles.
func (c *vendorCache) get(ctx context.Context, k *manifest.Kernel, limit int64) (*vendorEntry, error) {
	key := vendorKey{k.Name, k.PTXSHA256}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errdefs.Errorf(errdefs.ErrClosed, "kernel %q: the deployment is closed", k.Name)
	}
	e, ok := c.entries[key]
	if !ok {
		e = &vendorEntry{c: c, k: k, sem: make(chan struct{}, 1)}
		if c.entries == nil {
			c.entries = map[vendorKey]*vendorEntry{}
		}
		c.entries[key] = e
	}
	read := c.read
	c.mu.Unlock()
	if err := e.lock(ctx); err != nil {
		return nil, fmt.Errorf("kernel %q: %w", k.Name, err)
	}
	defer e.unlock()
	if e.ptx != nil {
		return e, nil
	}
	if read == nil {
		read = manifest.ReadFile
	}
	ptx, err := read(k.PTXFile, limit)
	if err != nil {
		return nil, fmt.Errorf("kernel %q: %w", k.Name, err)
	}
	if got := stages.SHA256(ptx); got != k.PTXSHA256 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: %q changed since the manifest was read: it hashes to %s, not %s", k.Name, k.PTXFile, got, k.PTXSHA256)
	}
	e.ptx = ptx
	return e, nil
}

// close drops every entry; a later get is refused with class closed.
// The programs' modules stay loaded until their device is closed (the
// deployment closes the platform after this).
func (c *vendorCache) close() {
	c.mu.Lock()
	c.closed, c.entries = true, nil
	c.mu.Unlock()
}

func (c *vendorCache) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// lock takes the entry's semaphore, or returns ctx's error first.
func (e *vendorEntry) lock(ctx context.Context) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (e *vendorEntry) unlock() { <-e.sem }

// cubin returns the entry's cubin for compute capability cc: compile's
// result for the entry's PTX on the first call for cc, the same bytes on
// later calls. compile's error is returned as it is, and not kept.
func (e *vendorEntry) cubin(ctx context.Context, cc string, compile func(ptx []byte) ([]byte, error)) ([]byte, error) {
	if err := e.lock(ctx); err != nil {
		return nil, fmt.Errorf("kernel %q: %w", e.k.Name, err)
	}
	defer e.unlock()
	if b, ok := e.cubins[cc]; ok {
		return b, nil
	}
	b, err := compile(e.ptx)
	if err != nil {
		return nil, err
	}
	if e.cubins == nil {
		e.cubins = map[string][]byte{}
	}
	e.cubins[cc] = b
	return b, nil
}

// program returns the entry's program on dev: load's result on the
// first call for dev, the same program on later calls. load's error is
// returned as it is, and not kept; once the cache is closed it is
// refused with class closed. It waits for the entry without a
// deadline: a session prepares its programs without a context, and a
// holder of the entry is bounded (a compile by the kernel's jit_timeout).
func (e *vendorEntry) program(dev hw.Device, load func() (hw.Program, error)) (hw.Program, error) {
	_ = e.lock(context.Background())
	defer e.unlock()
	if e.c.isClosed() {
		return nil, errdefs.Errorf(errdefs.ErrClosed, "kernel %q: the deployment is closed", e.k.Name)
	}
	if p, ok := e.progs[dev]; ok {
		return p, nil
	}
	p, err := load()
	if err != nil {
		return nil, err
	}
	if e.progs == nil {
		e.progs = map[hw.Device]hw.Program{}
	}
	e.progs[dev] = p
	return p, nil
}
