package stages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// WeightsTensor is one tensor of safetensors weights: its byte range in
// the weights' buffer (the file's data section), its dtype code (ABI.md
// §3, tensor_get) and its dimensions (at most [abi.MaxTensorRank]).
type WeightsTensor struct {
	Offset, Bytes uint64
	DType         uint32
	Dims          []uint64
}

// WeightsConfig describes weights to upload with [UploadWeights]. It is
// immutable: every WithX method returns a modified copy.
type WeightsConfig struct {
	name     string
	size     int64
	sha256   string
	budget   *hw.Budget
	tensors  map[string]WeightsTensor
	chunk    int
	progress func(done, total int64)
	prefix   []byte
}

// DefaultWeightsChunk is the size of each of the two host staging
// buffers an upload of weights goes through, unless
// [WeightsConfig.WithChunk] says otherwise.
const DefaultWeightsChunk = 8 << 20

// NewWeightsConfig returns the configuration of weights named name of
// size bytes (the bytes the device copy holds), with the defaults: no
// sha256 check, no budget (counted nowhere), no tensors (raw weights),
// [DefaultWeightsChunk] staging, no progress reports.
func NewWeightsConfig(name string, size int64) WeightsConfig {
	return WeightsConfig{name: name, size: size, chunk: DefaultWeightsChunk}
}

// WithSHA256 makes the upload hash the bytes it reads and refuse them
// (freeing the device copy) when they do not hash to sum (lower-case
// hex). Default: no check.
func (c WeightsConfig) WithSHA256(sum string) WeightsConfig { c.sha256 = sum; return c }

// WithHashPrefix gives the bytes that precede the uploaded ones in the
// file the sha256 of [WeightsConfig.WithSHA256] is of (a safetensors
// file's header, when only its data section is uploaded): they are
// hashed first. Default none.
func (c WeightsConfig) WithHashPrefix(b []byte) WeightsConfig { c.prefix = b; return c }

// WithBudget charges the device copy to b (the device-wide budget of
// the deployment), once, until the weights are freed. Default nil.
func (c WeightsConfig) WithBudget(b *hw.Budget) WeightsConfig { c.budget = b; return c }

// WithTensors names the tensors tensor_get finds in the weights (for
// safetensors; raw weights have none). Default none.
func (c WeightsConfig) WithTensors(t map[string]WeightsTensor) WeightsConfig { c.tensors = t; return c }

// WithChunk sets the size of each of the two staging buffers. Default
// [DefaultWeightsChunk].
func (c WeightsConfig) WithChunk(bytes int) WeightsConfig { c.chunk = bytes; return c }

// WithProgress calls fn after each chunk uploaded, with the bytes done
// and the total. Default none.
func (c WeightsConfig) WithProgress(fn func(done, total int64)) WeightsConfig {
	c.progress = fn
	return c
}

// Weights is a read-only artefact in device memory: one copy on one
// device, shared by every session that lists it ([SessionConfig.WithWeights]).
// A guest reaches it through weights_get and tensor_get (ABI.md §3) as a
// read-only buffer handle: it can be read by any command, never written
// or freed.
//
// Weights are counted: [UploadWeights] returns them holding one
// reference (the caller's), every session made with them holds one
// until it closes (a quarantined session never closes, so it keeps its
// reference), and [Weights.Release] drops one. The device copy is freed,
// and its budget charge released, when the last reference goes.
type Weights struct {
	name    string
	buf     hw.Buffer // charged to the configured budget until freed
	tensors map[string]WeightsTensor

	mu    sync.Mutex
	refs  int
	freed bool
}

// UploadWeights allocates size bytes on dev, charged to the configured
// budget, and uploads them from src in chunks through two host-visible
// (on CUDA: pinned) staging buffers, so that reading the next chunk
// overlaps the upload of the last and the host holds two chunks at most,
// whatever the size. The returned weights hold one reference, the
// caller's.
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument]: a size below 1, a tensor of rank
//     above [abi.MaxTensorRank] or outside the size, or bytes that do not
//     hash to the configured sha256 (the message gives both sums);
//   - [errdefs.ErrOutOfBudget]: the budget cannot take the copy;
//   - a read error of src (fewer than size bytes: [io.ErrUnexpectedEOF]);
//   - errors of the device, and ctx's end.
//
// On every error nothing stays allocated or charged, unless the device
// could not be drained (then the copy is kept, since a command may still
// write it).
func UploadWeights(ctx context.Context, dev hw.Device, cfg WeightsConfig, src io.Reader) (*Weights, error) {
	if cfg.size < 1 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "weights %q: %d bytes: weights hold at least one byte", cfg.name, cfg.size)
	}
	if int64(int(cfg.size)) != cfg.size {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "weights %q: %d bytes do not fit an allocation", cfg.name, cfg.size)
	}
	for name, t := range cfg.tensors {
		if len(t.Dims) > abi.MaxTensorRank || t.Offset > uint64(cfg.size) || t.Bytes > uint64(cfg.size)-t.Offset {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "weights %q: tensor %q: rank %d (at most %d), bytes [%d,+%d) of %d",
				cfg.name, name, len(t.Dims), abi.MaxTensorRank, t.Offset, t.Bytes, cfg.size)
		}
	}
	chunk := cfg.chunk
	if chunk <= 0 {
		chunk = DefaultWeightsChunk
	}
	chunk = int(min(int64(chunk), cfg.size))
	buf, err := dev.Alloc(int(cfg.size), 0, cfg.budget)
	if err != nil {
		return nil, fmt.Errorf("weights %q: %w", cfg.name, err)
	}
	w := &Weights{name: cfg.name, buf: buf, tensors: cfg.tensors, refs: 1}
	drained, err := upload(ctx, dev, buf, cfg, chunk, src)
	if err != nil {
		if drained {
			_ = buf.Free()
		}
		return nil, fmt.Errorf("weights %q: %w", cfg.name, err)
	}
	return w, nil
}

// upload copies cfg.size bytes of src into buf. drained reports whether
// no upload command is left in flight (so buf may be freed).
func upload(ctx context.Context, dev hw.Device, buf hw.Buffer, cfg WeightsConfig, chunk int, src io.Reader) (drained bool, err error) {
	str, err := dev.NewStream()
	if err != nil {
		return true, err
	}
	var staging [2][]byte
	var pinned []hw.Buffer
	defer func() {
		if cerr := str.Close(context.WithoutCancel(ctx)); cerr != nil {
			drained = false
			err = errors.Join(err, cerr)
		}
		if drained {
			for _, p := range pinned {
				_ = p.Free()
			}
		}
	}()
	for i := range staging {
		if p, aerr := dev.Alloc(chunk, hw.AllocHostVisible, nil); aerr == nil {
			if hb, herr := p.HostBytes(); herr == nil {
				pinned = append(pinned, p)
				staging[i] = hb[:chunk]
				continue
			}
			_ = p.Free()
		}
		staging[i] = make([]byte, chunk) // a device without host-visible memory
	}
	var hasher *chunkHasher
	if cfg.sha256 != "" {
		hasher = newChunkHasher(cfg.prefix)
		defer hasher.stop() // before the staging buffers are freed
	}
	var pending [2]hw.Completion
	var done int64
	for i := 0; done < cfg.size; i ^= 1 {
		if err := pending[i].Wait(ctx); err != nil {
			return true, err // the stream's Close (deferred) says whether it drained
		}
		hasher.wait(i)
		n := int(min(int64(chunk), cfg.size-done))
		b := staging[i][:n]
		if _, err := io.ReadFull(src, b); err != nil {
			return true, fmt.Errorf("reading byte %d of %d: %w", done, cfg.size, err)
		}
		hasher.add(i, b)
		if pending[i], err = str.Write(buf, int(done), b); err != nil {
			return true, err
		}
		done += int64(n)
		if cfg.progress != nil {
			cfg.progress(done, cfg.size)
		}
	}
	if err := str.Sync(ctx); err != nil {
		return true, err
	}
	if hasher != nil {
		if got := hasher.sum(); got != cfg.sha256 {
			return true, errdefs.Errorf(errdefs.ErrInvalidArgument, "the bytes hash to %s, not the declared sha256 %s", got, cfg.sha256)
		}
	}
	return true, nil
}

// chunkHasher hashes the chunks of an upload on a goroutine of its own,
// in order, so that hashing one chunk overlaps reading the next (and the
// device's copy of both). A staging buffer is refilled only once its
// chunk was hashed ([chunkHasher.wait]). Its methods are no-ops on a nil
// *chunkHasher (no sha256 to check).
type chunkHasher struct {
	h       hash.Hash
	jobs    chan hashJob
	acks    [2]chan struct{}
	busy    [2]bool
	exit    chan struct{}
	stopped bool
}

type hashJob struct {
	b []byte
	i int // the staging buffer
}

func newChunkHasher(prefix []byte) *chunkHasher {
	c := &chunkHasher{h: sha256.New(), jobs: make(chan hashJob, 2), exit: make(chan struct{})}
	c.h.Write(prefix)
	for i := range c.acks {
		c.acks[i] = make(chan struct{}, 1)
	}
	go func() {
		defer close(c.exit)
		for j := range c.jobs {
			c.h.Write(j.b)
			c.acks[j.i] <- struct{}{}
		}
	}()
	return c
}

// add hashes b, the chunk in staging buffer i, after the chunks before.
func (c *chunkHasher) add(i int, b []byte) {
	if c != nil {
		c.busy[i] = true
		c.jobs <- hashJob{b, i}
	}
}

// wait returns once staging buffer i's chunk, if any, was hashed.
func (c *chunkHasher) wait(i int) {
	if c != nil && c.busy[i] {
		<-c.acks[i]
		c.busy[i] = false
	}
}

// stop ends the goroutine once it hashed every chunk given; nothing of
// the staging buffers is read after it returns.
func (c *chunkHasher) stop() {
	if c != nil && !c.stopped {
		c.stopped = true
		close(c.jobs)
		<-c.exit
	}
}

// sum stops the hasher and returns the hex sha256 of everything added.
func (c *chunkHasher) sum() string {
	c.stop()
	return hex.EncodeToString(c.h.Sum(nil))
}

// Name is the weights' name.
func (w *Weights) Name() string { return w.name }

// Size is the device copy's size in bytes.
func (w *Weights) Size() int { return w.buf.Size() }

// Buffer is the device copy, for Go code of the host (a native session's
// commands, a check of what was uploaded). Guests reach it read-only;
// Go code that writes it or frees it breaks every session that shares
// it: only read it.
func (w *Weights) Buffer() hw.Buffer { return w.buf }

// Device is the device that holds the copy.
func (w *Weights) Device() hw.Device { return w.buf.Device() }

// Refs is the number of references held: the sessions made with the
// weights and not closed, and the caller's own until it releases it;
// 0 once freed.
func (w *Weights) Refs() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refs
}

// Retain adds a reference.
//
// # Errors
//
// [errdefs.ErrClosed] when the weights were freed already (their last
// reference went): the caller uploads them again.
func (w *Weights) Retain() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return errdefs.Errorf(errdefs.ErrClosed, "weights %q were freed", w.name)
	}
	w.refs++
	return nil
}

// Release drops a reference; the last one frees the device copy and
// releases its budget charge.
func (w *Weights) Release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed || w.refs <= 0 {
		return
	}
	w.refs--
	if w.refs == 0 {
		w.freed = true
		_ = w.buf.Free()
	}
}

// tensor finds a tensor by name.
func (w *Weights) tensor(name string) (WeightsTensor, bool) {
	t, ok := w.tensors[name]
	return t, ok
}

// readOnlyNote names the weights a read-only handle entry is.
func readOnlyNote(e *handleEntry) string {
	return fmt.Sprintf("the read-only weights %q", e.weights.name)
}

// tensorRecord writes tensor_get's record (ABI.md §3) into r.
func tensorRecord(r []byte, h abi.Handle, t WeightsTensor) {
	le := func(off int, v uint64) {
		for i := range 8 {
			r[off+i] = byte(v >> (8 * i))
		}
	}
	clear(r[:abi.TensorRecordSize])
	le(0, uint64(h))
	le(8, t.Offset)
	le(16, t.Bytes)
	le(24, uint64(t.DType)|uint64(len(t.Dims))<<32)
	for i, d := range t.Dims {
		le(32+8*i, d)
	}
}
