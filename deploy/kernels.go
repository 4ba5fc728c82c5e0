package deploy

import (
	"context"
	"fmt"

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
// session's device.
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
		ptx, err := manifest.ReadFile(k.PTXFile, d.Manifest.Runtime.MaxModuleSize)
		if err != nil {
			return cfg, fmt.Errorf("kernel %q: %w", k.Name, err)
		}
		if got := stages.SHA256(ptx); got != k.PTXSHA256 {
			return cfg, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: %q changed since the manifest was read: it hashes to %s, not %s", k.Name, k.PTXFile, got, k.PTXSHA256)
		}
		cubin, _, err := cuda.CompilePTX(ctx, cuda.JITConfig{
			CacheDir:          cacheDirOf(d.Manifest),
			Timeout:           k.JITTimeout,
			ComputeCapability: cd.ComputeCapability(),
			DriverVersion:     int32(d.cudaP.DriverVersion()),
		}, k.Name, ptx)
		if err != nil {
			return cfg, fmt.Errorf("session %q: %w", ms.Name, err)
		}
		info := hw.KernelInfo{Name: k.Name, Args: k.Spec().Args}
		file, entry := k.PTXFile, k.Entry
		cfg = cfg.WithVendorProgram(info, func(hd hw.Device) (hw.Program, error) {
			c, ok := hd.(*cuda.Device)
			if !ok {
				return nil, errdefs.Errorf(errdefs.ErrUnsupported, "vendor kernel %q: device %q is not a cuda GPU", info.Name, hd.Name())
			}
			return c.PrepareVendor(cubin, file, entry, info)
		})
	}
	return cfg, nil
}
