package emu

import "testing"

// A Config is a value: WithX returns a copy and leaves the receiver as it
// was, a zero Config means NewConfig's defaults, and a WithX called on a
// zero value keeps the other defaults.
func TestConfigDefaultsAndCopies(t *testing.T) {
	base := NewConfig()
	_ = base.WithBudget(1).WithOutputLimit(1)
	for _, tc := range []struct {
		name     string
		cfg      Config
		outLimit int
	}{
		{"NewConfig after a WithX copy", base, DefaultOutputLimit},
		{"zero", Config{}, DefaultOutputLimit},
		{"zero.WithOutputLimit", Config{}.WithOutputLimit(8), 8},
	} {
		e := New(tc.cfg)
		if e.budget != DefaultBudget || e.outLimit != tc.outLimit {
			t.Errorf("%s: budget %d, output limit %d; want %d, %d", tc.name, e.budget, e.outLimit, DefaultBudget, tc.outLimit)
		}
	}
}
