// Package sessions runs resident GPU–NPU sessions: one GPU program and
// one NPU program that stay resident on their devices and exchange data
// through shared memory with no host action between rounds, started by a
// host-written startup word.
//
// The protocol comes from the seed resident_session.rs:
//
//   - [NewResidentStartup] allocates a dedicated 64-byte host-coherent
//     line visible to both devices. Its first word is the decision: [Wait]
//     (0), [Run] (1) or [Abort] (2). Publishing a decision is an atomic
//     release store plus each device's prepared visibility action.
//   - [NewResidentSession] takes the startup line and two prepared
//     [Participant]s. Submit both, in either order, with
//     [ResidentSession.SubmitGPU] and [ResidentSession.SubmitNPU]; a
//     rejected submission publishes ABORT for the peer.
//   - [ResidentSession.Start] publishes RUN once both were accepted;
//     [ResidentSession.Abort] publishes ABORT before start. A session
//     publishes at most one decision; a failed publication poisons it.
//   - [ResidentSession.Wait] joins both participants under one deadline;
//     [ResidentSession.IsComplete] only reads cached retirement.
//   - [ResidentSession.Close] publishes ABORT if undecided, waits, and
//     quarantines the session (keeping every allocation a device may still
//     touch) if a participant did not retire or the session is poisoned.
//
// The participants themselves are package sessions/exchange's: two
// simulated ones, registered with the sim backend, and the CUDA
// backend's kernel and host program (exchange.NewSimExchange,
// exchange.NewCUDAExchange), which run a real, concurrent credit
// ping-pong over a shared payload. This package drives any two
// [Participant]s and imports no backend.
//
// Example, on the sim backend:
//
//	p := sim.New()
//	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
//	npu, _ := p.AddDevice("npu0", hw.EngineNPU, sim.NewDeviceConfig())
//	owner := host.NewOwner("exchange", hw.NewBudget("exchange", 1<<20))
//	gs, _ := owner.NewStream(gpu)
//	ns, _ := owner.NewStream(npu)
//
//	startup, err := sessions.NewResidentStartup(p, gpu, npu, owner.Budget())
//	if err != nil {
//		return err
//	}
//	g, n, payload, err := exchange.NewSimExchange(p, startup, gs, ns, 16, owner)
//	if err != nil {
//		return err
//	}
//	sess, err := sessions.NewResidentSession(startup, g, n, sessions.NewResidentConfig().WithOwner(owner))
//	if err != nil {
//		return err
//	}
//	defer sess.Close() // ABORT if undecided; quarantine if it cannot retire
//	if err := sess.SubmitNPU(); err != nil {
//		return err
//	}
//	if err := sess.SubmitGPU(); err != nil {
//		return err
//	}
//	if err := sess.Start(); err != nil {
//		return err
//	}
//	done, err := sess.WaitTimeout(time.Second)
//	// done && err == nil: exchange.ExchangeData(payload) equals
//	// exchange.ExpectedPayload(16).
package sessions
