package sessions

import (
	"testing"
	"time"
)

// A ResidentConfig is a value: WithX returns a copy and leaves the
// receiver as it was, a zero ResidentConfig means NewResidentConfig's
// defaults, and a WithX called on a zero value keeps the other defaults.
func TestResidentConfigDefaultsAndCopies(t *testing.T) {
	base := NewResidentConfig()
	_ = base.WithName("x").WithCloseTimeout(time.Second)
	for _, tc := range []struct {
		name, want string
		cfg        ResidentConfig
	}{
		{"NewResidentConfig after a WithX copy", "", base},
		{"zero", "", ResidentConfig{}.orDefaults()},
		{"zero.WithName", "n", ResidentConfig{}.WithName("n")},
	} {
		if tc.cfg.closeTimeout != DefaultCloseTimeout || tc.cfg.name != tc.want || tc.cfg.rt != nil || tc.cfg.owner != nil {
			t.Errorf("%s: close timeout %v, name %q; want %v, %q", tc.name, tc.cfg.closeTimeout, tc.cfg.name, DefaultCloseTimeout, tc.want)
		}
	}
}
