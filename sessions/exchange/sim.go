package exchange

import (
	"encoding/binary"
	"math"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/sessions"
)

// The simulated resident participants, registered with the sim backend:
//
//   - "resident_gpu_exchange" runs the GPU side,
//   - "resident_npu_exchange" runs the NPU side,
//
// each taking (startup line view, payload view, rounds). See
// [NewSimExchange] for the protocol and [ExpectedPayload] for its result.
const (
	SimGPUKernel = "resident_gpu_exchange"
	SimNPUKernel = "resident_npu_exchange"
)

func init() {
	sim.Register(SimGPUKernel, func(l *sim.Launch) error { return runExchange(l, true) })
	sim.Register(SimNPUKernel, func(l *sim.Launch) error { return runExchange(l, false) })
}

// ExchangeLen is the number of float32 values in the exchanged data block.
const ExchangeLen = 16

// MaxExchangeRounds bounds the rounds of a simulated exchange.
const MaxExchangeRounds = 1 << 24

// Layout of the simulated exchange payload. Each side's control words sit
// on a cache line of their own, which only that side writes; the data
// block is on a third line.
const (
	offGPUObserved = 0   // GPU: 1 once it has observed RUN
	offGPUCredit   = 4   // GPU → NPU: rounds the GPU has produced
	offNPUObserved = 64  // NPU: 1 once it has observed RUN
	offNPUCredit   = 68  // NPU → GPU: rounds the NPU has consumed
	offData        = 128 // ExchangeLen float32 values
)

// PayloadSize is the size in bytes of a simulated exchange payload: two
// control lines (one written by each side) and the data block.
const PayloadSize = offData + 4*ExchangeLen

// NewSimExchange builds the two simulated participants of a resident
// exchange on startup's devices, plus their shared payload, for
// [sessions.NewResidentSession]:
//
//   - The payload is [PayloadSize] bytes of host-coherent memory for both
//     devices (allocated through owner when it is not nil, so that it lives
//     and dies with the session given [sessions.ResidentConfig.WithOwner]; otherwise charged to no
//     budget and the caller frees it once the session closed healthy).
//     Its data block starts as x[i] = i.
//   - Each participant's program (through owner when given) polls the
//     startup word with acquire loads until RUN or ABORT. On ABORT it
//     retires at once without touching the payload. On RUN it marks its
//     "observed" word and runs rounds rounds of a credit ping-pong with no
//     host action in between: in round r the GPU waits for the NPU's
//     credit r, computes x = x*0.5 + r over the data block and
//     release-stores its credit r+1; the NPU waits for that credit,
//     computes x = x - 1 and release-stores its own credit r+1. The GPU
//     retires after seeing the NPU's last credit; both stop with an
//     [errdefs.ErrDeviceLost] error if their device is lost while they poll.
//
// gpuStream must be on startup.GPU() and npuStream on startup.NPU(). Read
// the result with [ExchangeData] after a successful Wait, and compare it
// with [ExpectedPayload].
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument] for a nil argument, streams on other devices
//     than startup's, or rounds outside [0, MaxExchangeRounds].
//   - Whatever allocating or preparing returns ([errdefs.ErrOutOfBudget],
//     [errdefs.ErrDeviceLost], [errdefs.ErrClosed], or [errdefs.ErrDeviceLost] for a
//     quarantined owner). Nothing is allocated after an error, except
//     through owner, which keeps what it made.
func NewSimExchange(p hw.Platform, startup *sessions.ResidentStartup, gpuStream, npuStream hw.Stream, rounds int, owner *host.Owner) (gpu, npu sessions.Participant, payload hw.Shared, err error) {
	if p == nil || startup == nil || gpuStream == nil || npuStream == nil {
		return sessions.Participant{}, sessions.Participant{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim exchange: nil platform, startup or stream")
	}
	return newExchange("sim exchange", p, startup, gpuStream, npuStream, rounds, owner, SimGPUKernel, SimNPUKernel)
}

// newExchange builds the two participants of an exchange with the given
// programs, plus their shared payload (see [NewSimExchange]); both
// backends' participants share the layout and arguments.
func newExchange(what string, p hw.Platform, startup *sessions.ResidentStartup, gpuStream, npuStream hw.Stream, rounds int, owner *host.Owner, gpuProgram, npuProgram string) (gpu, npu sessions.Participant, payload hw.Shared, err error) {
	if gpuStream.Device() != startup.GPU() || npuStream.Device() != startup.NPU() {
		return sessions.Participant{}, sessions.Participant{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: streams must be on the startup's devices %q and %q", what, startup.GPU().Name(), startup.NPU().Name())
	}
	if rounds < 0 || rounds > MaxExchangeRounds {
		return sessions.Participant{}, sessions.Participant{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: %d rounds outside [0, %d]", what, rounds, MaxExchangeRounds)
	}
	devs := []hw.Device{startup.GPU(), startup.NPU()}
	if owner != nil {
		payload, err = owner.AllocShared(p, PayloadSize, devs)
	} else {
		payload, err = p.AllocShared(PayloadSize, devs, nil)
	}
	if err != nil {
		return sessions.Participant{}, sessions.Participant{}, nil, err
	}
	fail := func(err error) (sessions.Participant, sessions.Participant, hw.Shared, error) {
		if owner == nil {
			_ = payload.Free()
		}
		return sessions.Participant{}, sessions.Participant{}, nil, err
	}
	b := payload.Bytes()
	clear(b)
	for i := range ExchangeLen {
		binary.NativeEndian.PutUint32(b[offData+4*i:], math.Float32bits(float32(i)))
	}
	build := func(st hw.Stream, program string) (sessions.Participant, error) {
		dev := st.Device()
		var prog hw.Program
		var err error
		if owner != nil {
			prog, err = owner.Prepare(dev, program)
		} else {
			prog, err = dev.Prepare(program)
		}
		if err != nil {
			return sessions.Participant{}, err
		}
		word, err := startup.Shared().View(dev)
		if err != nil {
			return sessions.Participant{}, err
		}
		data, err := payload.View(dev)
		if err != nil {
			return sessions.Participant{}, err
		}
		return sessions.Participant{Stream: st, Command: hw.Command{
			Program: prog,
			Args:    []hw.Arg{hw.BufferArg(word, 0, sessions.StartupSize), hw.BufferArg(data, 0, PayloadSize), hw.Uint(uint64(rounds))},
		}}, nil
	}
	if gpu, err = build(gpuStream, gpuProgram); err != nil {
		return fail(err)
	}
	if npu, err = build(npuStream, npuProgram); err != nil {
		return fail(err)
	}
	return gpu, npu, payload, nil
}

// ExpectedPayload is the data block a simulated exchange of rounds rounds
// leaves behind (see [NewSimExchange]), computed in plain Go with the same
// float32 operations in the same order.
func ExpectedPayload(rounds int) []float32 {
	x := make([]float32, ExchangeLen)
	for i := range x {
		x[i] = float32(i)
	}
	for r := range rounds {
		for i := range x {
			x[i] = float32(x[i]*0.5) + float32(r) // GPU
		}
		for i := range x {
			x[i] = x[i] - 1 // NPU
		}
	}
	return x
}

// ExchangeData copies the data block out of a simulated exchange payload.
// Call it only once both participants have retired (after a successful
// Wait), or with neither submitted.
//
// # Errors
//
// [errdefs.ErrInvalidArgument] for a payload smaller than [PayloadSize].
func ExchangeData(payload hw.Shared) ([]float32, error) {
	if payload == nil || payload.Size() < PayloadSize {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sim exchange: payload too small")
	}
	b := payload.Bytes()
	out := make([]float32, ExchangeLen)
	for i := range out {
		out[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[offData+4*i:]))
	}
	return out, nil
}

// runExchange is the body of both simulated participants.
func runExchange(l *sim.Launch, gpu bool) error {
	return exchangeSide(gpu, l.Args(), l.Bytes, l.Uint, l.Lost(), func() error { return l.Device().Err() })
}

// exchangeSide runs one participant of the exchange protocol (see
// [NewSimExchange]) over args (startup line view, payload view, rounds):
// the GPU side when gpu is true, else the NPU side. The simulated
// participants and the CUDA host program both run it; the CUDA GPU
// participant is the same protocol in kernels.cu. deviceErr reports the
// device's loss once lost is closed.
func exchangeSide(gpu bool, args []hw.Arg, bytes func(int) []byte, uintArg func(int) uint64, lost <-chan struct{}, deviceErr func() error) error {
	if n := len(args); n != 3 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "resident exchange takes 3 arguments, got %d", n)
	}
	line, payload, rounds := bytes(0), bytes(1), uintArg(2)
	if len(line) < 4 || len(payload) < PayloadSize || rounds > MaxExchangeRounds {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "resident exchange: startup range %d bytes, payload %d bytes (want ≥ %d), %d rounds",
			len(line), len(payload), PayloadSize, rounds)
	}
	if uintptr(unsafe.Pointer(&line[0]))%4 != 0 || uintptr(unsafe.Pointer(&payload[0]))%4 != 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "resident exchange: unaligned startup or payload range")
	}
	startup := (*uint32)(unsafe.Pointer(&line[0]))

	// Poll the startup word. Nothing else is touched before a decision.
	if !spinWhile(startup, sessions.Wait, lost) {
		return deviceErr()
	}
	switch decision := atomic.LoadUint32(startup); decision {
	case sessions.Abort:
		return nil // retire at once: no payload access, no peer progress
	case sessions.Run:
	default:
		return errdefs.Errorf(errdefs.ErrFault, "resident exchange: unknown startup decision %d", decision)
	}

	word := func(off int) *uint32 { return (*uint32)(unsafe.Pointer(&payload[off])) }
	gpuCredit, npuCredit := word(offGPUCredit), word(offNPUCredit)
	data := unsafe.Slice((*float32)(unsafe.Pointer(&payload[offData])), ExchangeLen)
	n := uint32(rounds)
	if gpu {
		atomic.StoreUint32(word(offGPUObserved), 1)
		for r := range n {
			if !spinFor(npuCredit, r, lost) {
				return deviceErr()
			}
			fr := float32(r)
			for i := range data {
				data[i] = float32(data[i]*0.5) + fr
			}
			atomic.StoreUint32(gpuCredit, r+1)
		}
		// Retire only once the NPU has consumed the last round, so the GPU's
		// completion covers the whole exchange.
		if !spinFor(npuCredit, n, lost) {
			return deviceErr()
		}
		return nil
	}
	atomic.StoreUint32(word(offNPUObserved), 1)
	for r := range n {
		if !spinFor(gpuCredit, r+1, lost) {
			return deviceErr()
		}
		for i := range data {
			data[i] = data[i] - 1
		}
		atomic.StoreUint32(npuCredit, r+1)
	}
	return nil
}

// spinFor polls w with acquire loads until it holds want (true) or the
// device is lost (false). It spins (a peer on another device answers in
// microseconds) and yields every 64 polls.
func spinFor(w *uint32, want uint32, lost <-chan struct{}) bool {
	return spin(w, func(v uint32) bool { return v != want }, lost)
}

// spinWhile polls w until it no longer holds v (true) or the device is
// lost (false).
func spinWhile(w *uint32, v uint32, lost <-chan struct{}) bool {
	return spin(w, func(got uint32) bool { return got == v }, lost)
}

// spinHot is how many loads spin polls (yielding every 64) before it
// backs off with sleeps: a peer that has not moved for that long (some
// milliseconds) is stalled, for example the peer of a quarantined run,
// and a participant waiting on it should not hold a core forever.
const spinHot = 1 << 20

// maxSpinSleep bounds the backoff: a stalled participant polls its word
// at least this often.
const maxSpinSleep = time.Millisecond

func spin(w *uint32, keep func(uint32) bool, lost <-chan struct{}) bool {
	sleep := 50 * time.Microsecond
	for i := 0; keep(atomic.LoadUint32(w)); i++ {
		if i%64 == 63 {
			select {
			case <-lost:
				return false
			default:
			}
			if i < spinHot {
				runtime.Gosched()
			} else {
				time.Sleep(sleep)
				sleep = min(2*sleep, maxSpinSleep)
			}
		}
	}
	return true
}
