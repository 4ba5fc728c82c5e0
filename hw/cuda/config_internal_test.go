package cuda

import "testing"

// A Config is a value: WithX returns a copy and leaves the receiver as it
// was, a zero Config means NewConfig's defaults, and a WithX called on a
// zero value (here the fake driver's) keeps the other defaults.
func TestConfigDefaultsAndCopies(t *testing.T) {
	base := NewConfig()
	_ = base.WithQueueDepth(4).WithBatchGraphs(0).WithCopyStaging(0).WithBLASLibrary("-")
	p, err := Open(Config{}.withDriver(newFake(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for name, cfg := range map[string]Config{"NewConfig after a WithX copy": base, "zero.withDriver": p.cfg} {
		if cfg.library != defaultLibrary || cfg.queueDepth != DefaultQueueDepth || cfg.batchGraphs != DefaultBatchGraphs ||
			cfg.copyStaging != DefaultCopyStaging || cfg.createTimeout != DefaultStreamCreateTimeout || cfg.noBLAS {
			t.Errorf("%s: %+v; want the defaults", name, cfg)
		}
	}
}
