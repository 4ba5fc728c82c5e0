package host

import (
	"time"

	"github.com/stagehost/stagehost/internal/monotime"
)

// Config configures a [Runtime]. It is immutable: every WithX method
// returns a modified copy, so a Config can be shared and reused.
//
//	rt, err := host.NewRuntime(host.NewConfig().WithCapacity(16))
type Config struct {
	capacity      int
	traceCapacity int
	clock         func() time.Time
}

// NewConfig returns the default configuration:
//
//   - capacity 64 (see [Config.WithCapacity]);
//   - trace capacity 4096 records (see [Config.WithTraceCapacity]).
func NewConfig() Config {
	return Config{capacity: 64, traceCapacity: 4096, clock: monotime.Now}
}

// WithCapacity sets the runtime's bounded submission capacity: the most
// admission units that may be held at once across all lanes. A native
// lease and a coordinated submission each hold their cost (default 1)
// from admission until release. Default 64; values < 1 are rejected by
// [NewRuntime].
func (c Config) WithCapacity(units int) Config {
	c.capacity = units
	return c
}

// WithTraceCapacity sets how many lane occupancies the tracer keeps in its
// ring; older records are overwritten. Default 4096; values < 1 are
// rejected by [NewRuntime].
func (c Config) WithTraceCapacity(records int) Config {
	c.traceCapacity = records
	return c
}
