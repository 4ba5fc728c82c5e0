package stages

import (
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/hw"
)

// A NativeConfig is a value: WithX returns a copy and leaves the receiver
// as it was, a zero NativeConfig means NewNativeConfig's defaults (in
// NewNative too), and a WithX called on a zero value keeps the other
// defaults.
func TestNativeConfigDefaultsAndCopies(t *testing.T) {
	rt, err := host.NewRuntime(host.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	base := NewNativeConfig()
	_ = base.WithFenceTimeout(time.Second).WithAdmissionCost(3).WithDevice("d")
	zero := NewNative(rt, host.NewOwner("o", hw.NewBudget("o", 1)), struct{}{}, nil, NativeConfig{})
	for _, tc := range []struct {
		name, device string
		cfg          NativeConfig
	}{
		{"NewNativeConfig after a WithX copy", "", base},
		{"NewNative with a zero config", "", zero.cfg},
		{"zero.WithDevice", "d", NativeConfig{}.WithDevice("d")},
	} {
		if tc.cfg.fenceTimeout != 10*time.Second || tc.cfg.cost != 1 || tc.cfg.device != tc.device || tc.cfg.laneTimeout != 0 {
			t.Errorf("%s: fence timeout %v, cost %d, device %q; want 10s, 1, %q", tc.name, tc.cfg.fenceTimeout, tc.cfg.cost, tc.cfg.device, tc.device)
		}
	}
}
