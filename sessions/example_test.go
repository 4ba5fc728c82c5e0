package sessions_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/sessions"
	"github.com/stagehost/stagehost/sessions/exchange"
)

func ExampleNewResidentStartup() {
	p := sim.New()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	npu, _ := p.AddDevice("npu0", hw.EngineNPU, sim.NewDeviceConfig())
	budget := hw.NewBudget("startup", 0)

	startup, err := sessions.NewResidentStartup(p, gpu, npu, budget)
	if err != nil {
		panic(err)
	}
	fmt.Println(startup.Shared().Size(), startup.Shared().Load32Acquire(0) == sessions.Wait, budget.Used())

	// Only a GPU engine can be the GPU side.
	_, err = sessions.NewResidentStartup(p, npu, gpu, nil)
	fmt.Println(err)

	fmt.Println(startup.Close(), budget.Used())
	// Output:
	// 64 true 64
	// resident startup requires a GPU engine, got npu device "npu0"
	// <nil> 0
}

func ExampleNewResidentSession() {
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	npu, _ := p.AddDevice("npu0", hw.EngineNPU, sim.NewDeviceConfig())
	owner := host.NewOwner("exchange", hw.NewBudget("exchange", 1<<20))
	gs, _ := owner.NewStream(gpu)
	ns, _ := owner.NewStream(npu)

	startup, err := sessions.NewResidentStartup(p, gpu, npu, owner.Budget())
	if err != nil {
		panic(err)
	}
	g, n, payload, err := exchange.NewSimExchange(p, startup, gs, ns, 16, owner)
	if err != nil {
		panic(err)
	}
	sess, err := sessions.NewResidentSession(startup, g, n, sessions.NewResidentConfig().WithOwner(owner).WithRuntime(rt))
	if err != nil {
		panic(err)
	}
	fmt.Println(sess.Start()) // refused: nothing submitted yet
	_ = sess.SubmitNPU()      // either order
	_ = sess.SubmitGPU()
	fmt.Println(sess.Start())

	done, err := sess.WaitTimeout(10 * time.Second)
	data, _ := exchange.ExchangeData(payload)
	fmt.Println(done, err, slices.Equal(data, exchange.ExpectedPayload(16)))
	fmt.Println(sess.Abort()) // a second decision is refused

	fmt.Println(sess.Close(), owner.Budget().Used(), rt.Tracer().Total())
	// Output:
	// resident session "exchange": both participants must be accepted before RUN
	// <nil>
	// true <nil> true
	// resident session "exchange": startup is already decided or failed
	// <nil> 0 2
}
