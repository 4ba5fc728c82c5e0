// Package host is stagehost's runtime: four submission lanes (compute,
// upload, download, npu) per device under one bounded submission capacity,
// native compute leases for stages, and a tracer of every lane occupancy.
// Its name is the host side of the sandbox (the code that hosts the
// stages); the other meanings of the word are other things, each with its
// own name (ARCHITECTURE.md's glossary): a lattice host is a process of a
// lattice, the host device "host0" is the CUDA platform's CPU device, a
// host function is a Wasm import of ABI v1, and the HTTP service is the
// service.
//
// A [Runtime] admits work in two phases. A request first takes its lane in
// arrival order: coordinated submissions ([Runtime.Submit]) share a lane,
// while a native lease ([Runtime.AcquireCompute]) holds the compute lane
// alone, waiting for earlier compute to drain and holding back later
// compute, and leaving the other lanes free. It then takes capacity units
// in one runtime-wide FIFO. A request waits until it is admitted, its
// context ends, or its [Op.Timeout] passes; one that gives up holds
// nothing, and those behind it move up in order. Leases are reusable
// values, so a stage costs no allocation.
//
//	rt, _ := host.NewRuntime(host.NewConfig().WithCapacity(16))
//	var lease host.Lease
//	if err := rt.AcquireCompute(ctx, host.Op{Owner: "mlp"}, &lease); err != nil {
//		return err
//	}
//	defer lease.Release(false)
//	// run the stage with lease.Context(), fence with lease.FenceContext(10*time.Second)
//
// Package stages builds sessions on top of this; package host/metrics
// exports a runtime to Prometheus.
package host
