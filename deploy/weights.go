package deploy

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// weightsKey names one device copy of weights.
type weightsKey struct{ name, device string }

// weightsState is the deployment's device copies of weights: at most
// one per weights and device, shared by every instance on that device
// of every session that lists the weights, and the device-wide budgets
// they are charged to.
type weightsState struct {
	mu      sync.Mutex
	copies  map[weightsKey]*stages.Weights
	budgets map[string]*hw.Budget // by device: [[device]] memory, counted
}

// progressAbove is the size above which an upload of weights logs its
// progress, a line per tenth.
const progressAbove = 64 << 20

// DeviceBudget returns the device-wide budget of the named device, or
// nil: weights are charged to it, once per device, whatever the number
// of sessions and instances that share them. Its limit is the device's
// memory in the manifest (0: unlimited, but counted).
func (d *Deployment) DeviceBudget(name string) *hw.Budget {
	d.weights.mu.Lock()
	defer d.weights.mu.Unlock()
	return d.weights.budgets[name]
}

// deviceBudget returns dev's budget, making it on first use.
func (d *Deployment) deviceBudgetLocked(dev string) *hw.Budget {
	if d.weights.budgets == nil {
		d.weights.budgets = map[string]*hw.Budget{}
		d.weights.copies = map[weightsKey]*stages.Weights{}
	}
	b := d.weights.budgets[dev]
	if b == nil {
		var limit int64
		if md := d.Manifest.Device(dev); md != nil {
			limit = md.Memory
		}
		b = hw.NewBudget("device "+dev, limit)
		d.weights.budgets[dev] = b
	}
	return b
}

// retainWeights returns the device copy of the named weights on dev
// holding a reference for the caller, uploading it if the device has
// none (or had one that was freed).
func (d *Deployment) retainWeights(ctx context.Context, name, dev string) (*stages.Weights, error) {
	d.weights.mu.Lock()
	defer d.weights.mu.Unlock()
	budget := d.deviceBudgetLocked(dev)
	k := weightsKey{name, dev}
	if w := d.weights.copies[k]; w != nil && w.Retain() == nil {
		return w, nil
	}
	mw := d.Manifest.WeightsNamed(name)
	if mw == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no weights %q in the manifest", name)
	}
	w, err := d.uploadWeights(ctx, mw, dev, budget)
	if err != nil {
		return nil, err
	}
	d.weights.copies[k] = w
	return w, nil
}

// uploadWeights reads mw's file as a stream, from its data offset, and
// uploads it to dev, hashing the whole file on the way (a file that no
// longer matches the manifest's sha256 is refused, and nothing of it
// stays charged). Uploads above 64 MiB log a line per tenth, and tell
// Config.WithProgress's function.
func (d *Deployment) uploadWeights(ctx context.Context, mw *manifest.Weights, dev string, budget *hw.Budget) (*stages.Weights, error) {
	device := d.devices[dev]
	if device == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "weights %q: no device %q", mw.Name, dev)
	}
	f, _, err := manifest.OpenFile(mw.File)
	if err != nil {
		return nil, fmt.Errorf("weights %q: %w", mw.Name, err)
	}
	defer f.Close()
	prefix := make([]byte, mw.DataOffset)
	if _, err := io.ReadFull(f, prefix); err != nil {
		return nil, fmt.Errorf("weights %q: reading %q: %w", mw.Name, mw.File, err)
	}
	tensors := map[string]stages.WeightsTensor{}
	for _, t := range mw.Tensors {
		tensors[t.Name] = stages.WeightsTensor{Offset: t.Begin, Bytes: t.End - t.Begin, DType: t.Code, Dims: t.Shape}
	}
	cfg := stages.NewWeightsConfig(mw.Name, mw.DataSize).WithBudget(budget).WithTensors(tensors).
		WithSHA256(mw.SHA256).WithHashPrefix(prefix)
	if mw.DataSize > progressAbove {
		next := int64(1)
		cfg = cfg.WithProgress(func(done, total int64) {
			for next <= 10 && done*10 >= total*next {
				msg := fmt.Sprintf("weights %s: %d%% uploaded to device %s (%.1f of %.1f MiB)", mw.Name, next*10, dev,
					float64(done)/(1<<20), float64(total)/(1<<20))
				d.logger.Info(msg, "weights", mw.Name, "device", dev)
				if d.progress != nil {
					d.progress(msg)
				}
				next++
			}
		})
	}
	d.logger.Info("uploading weights", "weights", mw.Name, "device", dev, "bytes", mw.DataSize)
	w, err := stages.UploadWeights(ctx, device, cfg, f)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", mw.File, err)
	}
	return w, nil
}

// loadWeights uploads, before any session is made, every weights that a
// session to open lists, to each device it has an instance on. The
// returned func drops the references taken here, once the sessions hold
// theirs.
func (d *Deployment) loadWeights(ctx context.Context, opt Config) (release func(), err error) {
	var held []*stages.Weights
	release = func() {
		for _, w := range held {
			w.Release()
		}
	}
	m := d.Manifest
	for i := range m.Sessions {
		ms := &m.Sessions[i]
		if opt.only != "" && ms.Name != opt.only || !d.onDevice(ms) {
			continue
		}
		for _, dev := range ms.Devices {
			if !d.wantsDevice(dev) {
				continue
			}
			for _, name := range ms.Weights {
				w, err := d.retainWeights(ctx, name, dev)
				if err != nil {
					release()
					return nil, fmt.Errorf("session %q: %w", ms.Name, err)
				}
				held = append(held, w)
			}
		}
	}
	return release, nil
}

// sessionWeights takes a reference to each weights ms lists on dev for
// a new instance's config; release drops them once the instance holds
// its own (or could not be made).
func (d *Deployment) sessionWeights(ctx context.Context, ms *manifest.Session, dev string) (ws []*stages.Weights, release func(), err error) {
	release = func() {
		for _, w := range ws {
			w.Release()
		}
	}
	for _, name := range ms.Weights {
		w, err := d.retainWeights(ctx, name, dev)
		if err != nil {
			release()
			return nil, func() {}, err
		}
		ws = append(ws, w)
	}
	return ws, release, nil
}
