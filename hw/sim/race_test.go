//go:build race

package sim_test

// raceEnabled: the race detector's instrumentation slows every submission
// and wake-up (a zero-latency round trip takes about 12 µs instead of 1).
const raceEnabled = true
