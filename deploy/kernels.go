package deploy

import (
	"context"
	"fmt"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
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
					continue // refused by refuseVendorPTX
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
func refuseVendorPTX(m *manifest.Manifest, device string) error {
	for _, s := range m.Sessions {
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
