package sim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/sim"
)

// A DeviceConfig is a value: WithX returns a copy and leaves the receiver
// as it was, a zero DeviceConfig means NewDeviceConfig's defaults, and a
// WithX called on a zero value keeps the other defaults.
func TestDeviceConfigDefaultsAndCopies(t *testing.T) {
	p := sim.New()
	defer p.Close()
	base := sim.NewDeviceConfig()
	_ = base.WithQueueDepth(4).WithInitialQueueDepth(2).WithLatency(time.Hour)
	for i, tc := range []struct {
		name    string
		cfg     sim.DeviceConfig
		latency time.Duration
	}{
		{"NewDeviceConfig after a WithX copy", base, 0},
		{"zero", sim.DeviceConfig{}, 0},
		{"zero.WithLatency", sim.DeviceConfig{}.WithLatency(time.Millisecond), time.Millisecond},
	} {
		d, err := p.AddDevice(fmt.Sprint("d", i), hw.EngineGPU, tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if d.QueueDepth() != sim.DefaultQueueDepth || d.InitialQueueDepth() != sim.DefaultInitialQueueDepth || d.Latency() != tc.latency {
			t.Errorf("%s: depth %d, initial %d, latency %v; want %d, %d, %v", tc.name,
				d.QueueDepth(), d.InitialQueueDepth(), d.Latency(), sim.DefaultQueueDepth, sim.DefaultInitialQueueDepth, tc.latency)
		}
	}
}
