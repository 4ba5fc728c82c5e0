// Package simrun runs an example stage module on the simulator backend
// (or on a given device: OpenOn), for the examples' tests: a fresh sim
// GPU, a session with stream "s0" and the given programs, one call per
// input.
package simrun

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

// Run loads the module at path into a session on a fresh sim GPU and
// calls it once per input, failing t on any error; it returns the outputs
// in order.
func Run(t testing.TB, path string, programs []string, inputs ...[]byte) [][]byte {
	t.Helper()
	return RunOn(t, path, programs, simGPU(t), inputs...)
}

// RunOn is Run on the given device.
func RunOn(t testing.TB, path string, programs []string, gpu hw.Device, inputs ...[]byte) [][]byte {
	t.Helper()
	call := OpenOn(t, path, programs, gpu)
	var outs [][]byte
	for i, in := range inputs {
		out, err := call(in)
		if err != nil {
			t.Fatalf("input %d: %v", i, err)
		}
		outs = append(outs, out)
	}
	return outs
}

// Open loads the module at path into a session on a fresh sim GPU and
// returns a function that calls it; everything is closed when t ends.
func Open(t testing.TB, path string, programs []string) func(input []byte) ([]byte, error) {
	t.Helper()
	return OpenOn(t, path, programs, simGPU(t))
}

// simGPU is the GPU of a fresh sim platform, closed when t ends.
func simGPU(t testing.TB) hw.Device {
	t.Helper()
	p := sim.New()
	t.Cleanup(func() { p.Close() })
	gpu, err := p.AddDevice("gpu0", hw.EngineGPU, sim.NewDeviceConfig())
	if err != nil {
		t.Fatal(err)
	}
	return gpu
}

// OpenOn is Open on the given device (a real GPU, say), which the caller
// keeps open until t ends.
func OpenOn(t testing.TB, path string, programs []string, gpu hw.Device) func(input []byte) ([]byte, error) {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := stages.NewEngine(ctx, stages.NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	m, err := eng.Load(ctx, bin, stages.SHA256(bin), stages.NewLoadConfig().WithName("example").WithWASI(stages.GrantGoRuntime))
	if err != nil {
		t.Fatal(err)
	}
	cfg := stages.NewSessionConfig("example", gpu).WithStreams("s0").WithPrograms(programs...).
		WithBudget(64 << 20).WithDeadline(time.Minute).WithFenceTimeout(time.Minute)
	s, err := eng.NewSession(ctx, rt, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(ctx) })
	return func(in []byte) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return s.Run(ctx, in, nil)
	}
}
