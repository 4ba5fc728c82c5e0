package stages_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

func ExampleNewNative() {
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())

	owner := host.NewOwner("relu-model", hw.NewBudget("relu-model", 1<<20))
	stream, _ := owner.NewStream(gpu)
	relu, _ := owner.Prepare(gpu, "relu")
	x, _ := owner.Alloc(gpu, 16, 0)

	sess := stages.NewNative(rt, owner, struct{}{}, nil, stages.NewNativeConfig()) // nil: built-in drain fence
	input := make([]byte, 16)
	for i, v := range []float32{-2, -1, 1, 2} {
		binary.LittleEndian.PutUint32(input[4*i:], math.Float32bits(v))
	}
	out := make([]byte, 16)
	err := sess.Run(context.Background(), func(ctx context.Context, _ *struct{}) error {
		if _, err := stream.Write(x, 0, input); err != nil {
			return err
		}
		if _, err := stream.Submit(&hw.Command{Program: relu, Args: []hw.Arg{hw.BufferArg(x, 0, -1)}}); err != nil {
			return err
		}
		c, err := stream.Read(x, 0, out)
		if err != nil {
			return err
		}
		return c.Wait(ctx)
	})
	for i := 0; i < 4; i++ {
		fmt.Print(math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])), " ")
	}
	fmt.Println(err)
	fmt.Println(sess.Close(context.Background()))
	// Output:
	// 0 0 1 2 <nil>
	// <nil>
}

func ExampleEngine_Load() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	bin, _ := os.ReadFile("testdata/hostile/good_stage.wasm")
	_, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("good"))
	fmt.Println(err)
	bad, _ := os.ReadFile("testdata/hostile/unknown_import.wasm")
	_, err = eng.Load(ctx, bad, stages.SHA256(bad), stages.NewLoadConfig().WithName("exfil"))
	fmt.Println(errors.Is(err, errdefs.ErrInvalidArgument), err)
	// Output:
	// <nil>
	// true module "exfil": imports env.exfiltrate: only stagehost_v1 functions and granted WASI functions may be imported
}

func ExampleEngine_NewSession() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())

	bin, _ := os.ReadFile("testdata/hostile/good_stage.wasm")
	mod, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("good"))
	sess, err := eng.NewSession(ctx, rt, mod, stages.NewSessionConfig("demo", gpu).
		WithStreams("s0").WithPrograms("noop").WithDeadline(time.Second))
	if err != nil {
		panic(err)
	}
	out, err := sess.Run(ctx, nil, nil)
	fmt.Printf("%q %v\n", out, err)
	fmt.Println(sess.Close(ctx))
	// Output:
	// "ok" <nil>
	// <nil>
}

// The Go API snippet of the README, as written there.
func ExampleEngine_NewSession_readme() {
	ctx := context.Background()
	rt, _ := host.NewRuntime(host.NewConfig().WithCapacity(16))
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig().WithLatency(50*time.Microsecond))

	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig())
	defer eng.Close(ctx)
	bin, _ := os.ReadFile("../examples/wasm/cstage/cstage.wasm")
	mod, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("cstage"))
	sess, _ := eng.NewSession(ctx, rt, mod, stages.NewSessionConfig("fill", gpu).WithStreams("s0").WithPrograms("fill"))
	var input []byte
	out, err := sess.Run(ctx, input, nil)

	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(out)), err)
	// Output:
	// 40 <nil>
}

// A module's instances start from a snapshot of its state after
// initialisation, taken once at load; a module loaded with
// WithSnapshot(false) initialises every instance itself.
func ExampleModule_Snapshot() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	bin, _ := os.ReadFile("testdata/snapshot/snap_state.wasm")
	mod, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("state"))
	ok, _ := mod.Snapshot()
	fmt.Println(ok)
	off, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("state").WithSnapshot(false))
	fmt.Println(off.Snapshot())
	hc, _ := os.ReadFile("testdata/snapshot/snap_hostcall.wasm")
	logs, _ := eng.Load(ctx, hc, stages.SHA256(hc), stages.NewLoadConfig().WithName("logs"))
	fmt.Println(logs.Snapshot())
	// Output:
	// true
	// false snapshots are turned off for the module
	// false its initialisation calls stagehost_v1.log
}

// With WithResetPerCall every call starts from the snapshot: what a call
// leaves in guest memory never reaches the next one.
func ExampleSessionConfig_WithResetPerCall() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	// snap_state outputs, among other things, the 4 bytes that the
	// previous call stored, then stores its input there.
	bin, _ := os.ReadFile("testdata/snapshot/snap_state.wasm")
	mod, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("state"))
	for _, reset := range []bool{false, true} {
		sess, _ := eng.NewSession(ctx, rt, mod, stages.NewSessionConfig("tenant", gpu).WithResetPerCall(reset))
		a, _ := sess.Run(ctx, []byte("AAAA"), nil)
		b, _ := sess.Run(ctx, []byte("BBBB"), nil)
		fmt.Printf("reset %v: %q then %q (%d resets)\n", reset, a[:4], b[:4], sess.Resets())
		_ = sess.Close(ctx)
	}
	// Output:
	// reset false: "init" then "AAAA" (0 resets)
	// reset true: "init" then "init" (2 resets)
}

// Upload weights once and share them: every session made with them reads
// the one device copy, charged once to the budget given here.
func ExampleUploadWeights() {
	ctx := context.Background()
	eng, _ := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	defer eng.Close(ctx)
	rt, _ := host.NewRuntime(host.NewConfig())
	p := sim.New()
	defer p.Close()
	gpu, _ := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	device := hw.NewBudget("device gpu0", 1<<20)

	data := []byte("raw weight bytes")
	w, err := stages.UploadWeights(ctx, gpu, stages.NewWeightsConfig("table", int64(len(data))).
		WithBudget(device).WithSHA256(stages.SHA256(data)), bytes.NewReader(data))
	if err != nil {
		panic(err)
	}
	bin, _ := os.ReadFile("testdata/hostile/good_stage.wasm")
	mod, _ := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("good"))
	var sessions []*stages.Session
	for i := range 3 {
		s, err := eng.NewSession(ctx, rt, mod, stages.NewSessionConfig(fmt.Sprint("s", i), gpu).
			WithStreams("s0").WithPrograms("noop").WithWeights(w))
		if err != nil {
			panic(err)
		}
		sessions = append(sessions, s)
	}
	w.Release() // the sessions hold their own references
	fmt.Println(device.Used(), w.Refs())
	for _, s := range sessions {
		s.Close(ctx)
	}
	fmt.Println(device.Used(), w.Refs())
	// Output:
	// 16 3
	// 0 0
}
