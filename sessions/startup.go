package sessions

import (
	"sync/atomic"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// The startup decisions, published in the first 32-bit word of a
// [ResidentStartup] line. Participants poll that word with acquire loads
// before touching anything else.
const (
	// Wait: no decision yet. The line is zeroed at allocation, so a fresh
	// startup reads Wait.
	Wait uint32 = 0
	// Run: both participants were accepted; run the exchange.
	Run uint32 = 1
	// Abort: retire at once, without touching the payload and without
	// waiting for the peer.
	Abort uint32 = 2
)

// StartupSize is the size of the startup line in bytes: one dedicated
// cache line.
const StartupSize = 64

// Lifecycle of a startup line (ResidentStartup.state).
const (
	startupFree   int32 = iota // made, not yet given to a session
	startupBound               // owned by its one ResidentSession
	startupClosed              // freed by ResidentStartup.Close
)

// ResidentStartup is the dedicated, host-written startup line of one
// resident GPU–NPU session: [StartupSize] bytes of host-coherent memory
// that both devices can access, holding the decision word (WAIT=0, RUN=1,
// ABORT=2) at offset 0. Both participants must poll it before touching
// their shared payload.
//
// The host is the line's only writer. Publishing a decision is an atomic
// release store of the word followed by one prepared [hw.VisibilityAction]
// per device, all prepared at construction, so publishing allocates
// nothing.
//
// A startup serves exactly one [ResidentSession]: [NewResidentSession]
// takes ownership of it, and the session frees it (or, when quarantined,
// keeps it). Its methods are safe for concurrent use.
type ResidentStartup struct {
	shared      hw.Shared
	gpu, npu    hw.Device
	publication [2]hw.VisibilityAction // gpu, then npu
	state       atomic.Int32
}

// NewResidentStartup allocates and zeroes an isolated 64-byte startup line
// on p, accessible to gpu and npu and charged to budget (nil: none), and
// prepares one release visibility action per device.
//
// gpu must be a GPU engine ([hw.EngineGPU]). npu must be an NPU engine
// ([hw.EngineNPU]) or, on machines without an NPU, a host engine
// ([hw.EngineCPU]) standing in for it: a CPU peer follows exactly the same
// protocol and gets the same visibility action, so sessions, tests and
// benchmarks run unchanged on GPU-only hosts.
//
//	startup, err := sessions.NewResidentStartup(platform, gpu, npu, budget)
//	if err != nil {
//		return err
//	}
//	// build both participants against startup.Shared(), then
//	sess, err := sessions.NewResidentSession(startup, gpuPart, npuPart, sessions.NewResidentConfig())
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument] for a nil platform or device.
//   - [errdefs.ErrUnsupported] when gpu is not a GPU engine, npu is neither an
//     NPU nor a CPU engine, or the platform's host mapping of the line is
//     not 64-byte aligned (the line would not be an isolated cache line).
//   - Whatever [hw.Platform.AllocShared] or [hw.Shared.PrepareRelease]
//     return: [errdefs.ErrOutOfBudget] when budget cannot hold 64 more bytes,
//     [errdefs.ErrDeviceLost] or [errdefs.ErrClosed] for an unusable device. Nothing
//     stays allocated or charged after an error.
func NewResidentStartup(p hw.Platform, gpu, npu hw.Device, budget *hw.Budget) (*ResidentStartup, error) {
	if p == nil || gpu == nil || npu == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "resident startup: nil platform or device")
	}
	if gpu.Engine() != hw.EngineGPU {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "resident startup requires a GPU engine, got %s device %q", gpu.Engine(), gpu.Name())
	}
	if e := npu.Engine(); e != hw.EngineNPU && e != hw.EngineCPU {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "resident startup requires an NPU (or CPU) peer, got %s device %q", e, npu.Name())
	}
	sh, err := p.AllocShared(StartupSize, []hw.Device{gpu, npu}, budget)
	if err != nil {
		return nil, err
	}
	st := &ResidentStartup{shared: sh, gpu: gpu, npu: npu}
	if err := st.init(); err != nil {
		_ = sh.Free()
		return nil, err
	}
	return st, nil
}

func (st *ResidentStartup) init() error {
	b := st.shared.Bytes()
	if len(b) != StartupSize {
		return errdefs.Errorf(errdefs.ErrUnsupported, "resident startup: platform returned %d bytes for a %d-byte line", len(b), StartupSize)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%StartupSize != 0 {
		return errdefs.Errorf(errdefs.ErrUnsupported, "resident startup: host mapping is not %d-byte aligned", StartupSize)
	}
	clear(b)
	st.shared.Store32Release(0, Wait)
	for i, dev := range [2]hw.Device{st.gpu, st.npu} {
		a, err := st.shared.PrepareRelease(dev, 0, StartupSize)
		if err != nil {
			return err
		}
		st.publication[i] = a
	}
	return nil
}

// Shared returns the startup line, for building participants: pass
// Shared().View(dev) (range 0..64) to the program running on dev. The
// caller must never write it, free it, or hand it to anything but the two
// participants.
func (st *ResidentStartup) Shared() hw.Shared { return st.shared }

// GPU is the GPU device the line was allocated for.
func (st *ResidentStartup) GPU() hw.Device { return st.gpu }

// NPU is the peer device (an NPU, or a CPU standing in for one).
func (st *ResidentStartup) NPU() hw.Device { return st.npu }

// Close frees a startup line that was never given to a session, releasing
// its budget charge. A session frees (or quarantines) its own line.
//
// # Errors
//
// [errdefs.ErrBusy] once the line belongs to a [ResidentSession];
// [errdefs.ErrClosed] when closed twice.
func (st *ResidentStartup) Close() error {
	if st.state.CompareAndSwap(startupFree, startupClosed) {
		return st.shared.Free()
	}
	if st.state.Load() == startupBound {
		return errdefs.Errorf(errdefs.ErrBusy, "resident startup belongs to a session; close the session instead")
	}
	return errdefs.Errorf(errdefs.ErrClosed, "resident startup closed twice")
}

// publish stores decision with release ordering and then executes every
// device's prepared visibility action. It executes all of them even when
// one fails (so that a peer that can still be reached does see the
// decision) and returns the first error. It allocates nothing.
func (st *ResidentStartup) publish(decision uint32) error {
	// Trusted protocol: this dedicated line has exactly one host writer,
	// and devices only poll its first word.
	st.shared.Store32Release(0, decision)
	var first error
	for _, a := range st.publication {
		if err := a.Execute(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
