package exchange

import (
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/sessions"
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

// Offsets of the payload's credit words, for watching an exchange's
// progress: the rounds the GPU has produced and the NPU has consumed.
const (
	GPUCreditOffset = offGPUCredit
	NPUCreditOffset = offNPUCredit
)

// NewCUDAExchange builds the two participants of a resident exchange on
// the CUDA backend, plus their shared payload, for [sessions.NewResidentSession]:
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
//   - [errdefs.ErrInvalidArgument] for a nil argument, a startup or streams on
//     other devices, or rounds outside [0, MaxExchangeRounds].
//   - Whatever allocating or preparing returns ([errdefs.ErrOutOfBudget],
//     [errdefs.ErrDeviceLost], [errdefs.ErrClosed], or [errdefs.ErrDeviceLost] for a
//     quarantined owner). Nothing is allocated after an error, except
//     through owner, which keeps what it made.
func NewCUDAExchange(p *cuda.Platform, startup *sessions.ResidentStartup, gpuStream, hostStream hw.Stream, rounds int, owner *host.Owner) (gpu, npu sessions.Participant, payload hw.Shared, err error) {
	fail0 := func(format string, args ...any) (sessions.Participant, sessions.Participant, hw.Shared, error) {
		return sessions.Participant{}, sessions.Participant{}, nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda exchange: "+format, args...)
	}
	if p == nil || startup == nil || gpuStream == nil || hostStream == nil {
		return fail0("nil platform, startup or stream")
	}
	if startup.NPU() != hw.Device(p.Host()) {
		return fail0("the startup's peer is %q, not the platform's host device %q", startup.NPU().Name(), cuda.HostDeviceName)
	}
	if _, ok := startup.GPU().(*cuda.Device); !ok {
		return fail0("the startup's GPU %q is not a CUDA device", startup.GPU().Name())
	}
	return newExchange("cuda exchange", p, startup, gpuStream, hostStream, rounds, owner, CUDAGPUKernel, CUDAHostProgram)
}

// runHostExchange is the NPU side of the exchange on the host device:
// the same steps as the simulated NPU participant (see NewSimExchange).
func runHostExchange(l *cuda.HostLaunch) error {
	return exchangeSide(false, l.Args(), l.Bytes, l.Uint, l.Lost(), func() error { return l.Device().Err() })
}
