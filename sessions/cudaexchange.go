package sessions

import (
	"encoding/binary"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/stages"
)

// The CUDA resident participants:
//
//   - [CUDAGPUKernel] is a real kernel of the CUDA backend's module
//     (hw/cuda/kernels/kernels.cu), launched as one block on a GPU;
//   - [CUDAHostProgram] is a Go program registered with
//     [cuda.RegisterHostProgram], run on the platform's host device
//     ("host0"), which stands in for the NPU.
//
// Both take (startup line view, payload view, rounds) and follow the
// protocol of [NewSimExchange].
const (
	CUDAGPUKernel   = "resident_gpu_exchange"
	CUDAHostProgram = "resident_npu_exchange"
)

func init() { cuda.RegisterHostProgram(CUDAHostProgram, runHostExchange) }

// Offsets of the payload's observed words, for timing a start-up: the
// participant release-stores 1 there as soon as it has observed RUN.
const (
	GPUObservedOffset = offGPUObserved
	NPUObservedOffset = offNPUObserved
)

// NewCUDAExchange builds the two participants of a resident exchange on
// the CUDA backend, plus their shared payload, for [NewResidentSession]:
// the same payload layout, protocol and result as [NewSimExchange], so
// [ExchangeData] and [ExpectedPayload] verify it.
//
//   - startup must have been made on p for a GPU of p (startup.GPU()) and
//     the host device (startup.NPU() == p.Host());
//   - gpuStream must be a stream of startup.GPU(), hostStream one of the
//     host device;
//   - the payload is [PayloadSize] bytes of pinned memory mapped for both
//     (cuMemHostAlloc PORTABLE|DEVICEMAP), allocated through owner when it
//     is not nil (otherwise charged to no budget, and the caller frees it
//     once the session closed healthy); its data block starts as x[i] = i.
//
// The GPU participant is the kernel [CUDAGPUKernel]: it polls the startup
// word with ld.acquire.sys loads, release-stores its observed word (with
// st.release.sys) as soon as it sees RUN, and release-stores its credits;
// its arithmetic is unfused (mul.rn then add.rn), so the payload matches
// [ExpectedPayload] bit for bit. The NPU participant is the host program
// [CUDAHostProgram] on the same mapped memory. The kernel is part of the
// module every device loads eagerly at [cuda.Open] (every kernel's
// function is fetched there, which is what loads it under CUDA's lazy
// loading), so launching it never waits for a module load, which could
// otherwise deadlock against a parked resident kernel.
//
// # Errors
//
//   - [hw.ErrInvalidArgument] for a nil argument, a startup or streams on
//     other devices, or rounds outside [0, MaxExchangeRounds].
//   - Whatever allocating or preparing returns ([hw.ErrOutOfBudget],
//     [hw.ErrDeviceLost], [hw.ErrClosed], or [hw.ErrDeviceLost] for a
//     quarantined owner). Nothing is allocated after an error, except
//     through owner, which keeps what it made.
func NewCUDAExchange(p *cuda.Platform, startup *ResidentStartup, gpuStream, hostStream hw.Stream, rounds int, owner *stages.Owner) (gpu, npu Participant, payload hw.Shared, err error) {
	fail0 := func(format string, args ...any) (Participant, Participant, hw.Shared, error) {
		return Participant{}, Participant{}, nil, hw.Errorf(hw.ErrInvalidArgument, "cuda exchange: "+format, args...)
	}
	if p == nil || startup == nil || gpuStream == nil || hostStream == nil {
		return fail0("nil platform, startup or stream")
	}
	if startup.npu != hw.Device(p.Host()) {
		return fail0("the startup's peer is %q, not the platform's host device %q", startup.npu.Name(), cuda.HostDeviceName)
	}
	if _, ok := startup.gpu.(*cuda.Device); !ok {
		return fail0("the startup's GPU %q is not a CUDA device", startup.gpu.Name())
	}
	if gpuStream.Device() != startup.gpu || hostStream.Device() != startup.npu {
		return fail0("streams must be on the startup's devices %q and %q", startup.gpu.Name(), startup.npu.Name())
	}
	if rounds < 0 || rounds > MaxExchangeRounds {
		return fail0("%d rounds outside [0, %d]", rounds, MaxExchangeRounds)
	}
	devs := []hw.Device{startup.gpu, startup.npu}
	if owner != nil {
		payload, err = owner.AllocShared(p, PayloadSize, devs)
	} else {
		payload, err = p.AllocShared(PayloadSize, devs, nil)
	}
	if err != nil {
		return Participant{}, Participant{}, nil, err
	}
	fail := func(err error) (Participant, Participant, hw.Shared, error) {
		if owner == nil {
			_ = payload.Free()
		}
		return Participant{}, Participant{}, nil, err
	}
	b := payload.Bytes()
	clear(b)
	for i := range ExchangeLen {
		binary.NativeEndian.PutUint32(b[offData+4*i:], math.Float32bits(float32(i)))
	}
	build := func(st hw.Stream, program string) (Participant, error) {
		dev := st.Device()
		var prog hw.Program
		var err error
		if owner != nil {
			prog, err = owner.Prepare(dev, program)
		} else {
			prog, err = dev.Prepare(program)
		}
		if err != nil {
			return Participant{}, err
		}
		word, err := startup.shared.View(dev)
		if err != nil {
			return Participant{}, err
		}
		data, err := payload.View(dev)
		if err != nil {
			return Participant{}, err
		}
		return Participant{Stream: st, Command: hw.Command{
			Program: prog,
			Args:    []hw.Arg{hw.BufferArg(word, 0, StartupSize), hw.BufferArg(data, 0, PayloadSize), hw.Uint(uint64(rounds))},
		}}, nil
	}
	if gpu, err = build(gpuStream, CUDAGPUKernel); err != nil {
		return fail(err)
	}
	if npu, err = build(hostStream, CUDAHostProgram); err != nil {
		return fail(err)
	}
	return gpu, npu, payload, nil
}

// runHostExchange is the NPU side of the exchange on the host device:
// the same steps as the simulated NPU participant (see NewSimExchange).
func runHostExchange(l *cuda.HostLaunch) error {
	if n := len(l.Args()); n != 3 {
		return hw.Errorf(hw.ErrInvalidArgument, "resident exchange takes 3 arguments, got %d", n)
	}
	line, payload, rounds := l.Bytes(0), l.Bytes(1), l.Uint(2)
	if len(line) < 4 || len(payload) < PayloadSize || rounds > MaxExchangeRounds {
		return hw.Errorf(hw.ErrInvalidArgument, "resident exchange: startup range %d bytes, payload %d bytes (want ≥ %d), %d rounds",
			len(line), len(payload), PayloadSize, rounds)
	}
	if uintptr(unsafe.Pointer(&line[0]))%4 != 0 || uintptr(unsafe.Pointer(&payload[0]))%4 != 0 {
		return hw.Errorf(hw.ErrInvalidArgument, "resident exchange: unaligned startup or payload range")
	}
	lost := l.Lost()
	startup := (*uint32)(unsafe.Pointer(&line[0]))

	// Poll the startup word. Nothing else is touched before a decision.
	decision := atomic.LoadUint32(startup)
	for i := 0; decision == Wait; i++ {
		if i%64 == 63 {
			select {
			case <-lost:
				return l.Device().Err()
			default:
			}
			runtime.Gosched()
		}
		decision = atomic.LoadUint32(startup)
	}
	switch decision {
	case Abort:
		return nil // retire at once: no payload access, no peer progress
	case Run:
	default:
		return hw.Errorf(hw.ErrFault, "resident exchange: unknown startup decision %d", decision)
	}
	word := func(off int) *uint32 { return (*uint32)(unsafe.Pointer(&payload[off])) }
	atomic.StoreUint32(word(offNPUObserved), 1)
	gpuCredit, npuCredit := word(offGPUCredit), word(offNPUCredit)
	data := unsafe.Slice((*float32)(unsafe.Pointer(&payload[offData])), ExchangeLen)
	for r := range uint32(rounds) {
		if !spinFor(gpuCredit, r+1, lost) {
			return l.Device().Err()
		}
		for i := range data {
			data[i] = data[i] - 1
		}
		atomic.StoreUint32(npuCredit, r+1)
	}
	return nil
}

// spinFor polls w with acquire loads until it holds want (true) or the
// device is lost (false). It spins (the GPU's credit arrives over PCIe in
// microseconds) and yields every 64 polls.
func spinFor(w *uint32, want uint32, lost <-chan struct{}) bool {
	for i := 0; atomic.LoadUint32(w) != want; i++ {
		if i%64 == 63 {
			select {
			case <-lost:
				return false
			default:
			}
			runtime.Gosched()
		}
	}
	return true
}
