package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"
)

// clockOut decodes snap_clock's output (see its source).
type clockOut struct {
	initMono, initWall int64
	initRand           []byte
	mono, wall         int64
	rand               []byte
	lastMono           int64
}

func runClock(t *testing.T, s *Session, extraReads uint32) clockOut {
	t.Helper()
	in := binary.LittleEndian.AppendUint32(nil, extraReads)
	out, err := s.Run(context.Background(), in, nil)
	if err != nil || len(out) != 72 {
		t.Fatalf("snap_clock: %d bytes, %v", len(out), err)
	}
	i64 := func(at int) int64 { return int64(binary.LittleEndian.Uint64(out[at:])) }
	return clockOut{initMono: i64(0), initWall: i64(8), initRand: out[16:32],
		mono: i64(32), wall: i64(40), rand: out[48:64], lastMono: i64(64)}
}

// entropySessions returns sessions of snap_clock, made from its snapshot
// and without one, with and without reset per call.
func entropySessions(t *testing.T, f *wasmFixture) map[string]*Session {
	t.Helper()
	snap := snapModule(t, f.eng, "snap_clock", true)
	if ok, why := snap.Snapshot(); !ok {
		t.Fatalf("snap_clock is not snapshotted: %s", why)
	}
	plain := snapModule(t, f.eng, "snap_clock", false)
	out := map[string]*Session{}
	for name, m := range map[string]*Module{"snapshot": snap, "no snapshot": plain} {
		out[name] = f.session(t, m, f.defaultConfig(name).WithDeadline(30*time.Second))
		out[name+", reset"] = f.session(t, m, f.defaultConfig(name+" reset").WithDeadline(30*time.Second).WithResetPerCall(true))
	}
	t.Cleanup(func() {
		for _, s := range out {
			s.Close(context.Background())
		}
	})
	return out
}

// TestRandomIsFreshInEveryInstanceAndCall: random_get gives every
// instance, and every call under reset = "call", fresh bytes from the
// host's CSPRNG (ABI.md §1.2, §4.3.1, §4.3.2): two sessions of a module
// read different bytes in their calls, and so do two calls of a session
// whose instance returns to the snapshot between them. What the
// snapshot's initialisation read is the snapshot's, the same in every
// instance made from it; an instance that initialises itself reads its
// own.
func TestRandomIsFreshInEveryInstanceAndCall(t *testing.T) {
	f := newWasmFixture(t)
	sessions := entropySessions(t, f)
	seen := map[string]string{} // random bytes → who read them
	note := func(who string, b []byte) {
		if bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s read 16 zero bytes", who)
		}
		if other, ok := seen[string(b)]; ok {
			t.Fatalf("%s read the random bytes %x that %s read", who, b, other)
		}
		seen[string(b)] = who
	}
	inits := map[string][]byte{}
	for name, s := range sessions {
		for call := range 3 {
			got := runClock(t, s, 0)
			who := name + ", call " + string(rune('1'+call))
			note(who, got.rand)
			switch {
			case call == 0:
				inits[name] = got.initRand
			case name == "no snapshot, reset":
				// Every call has a new instance, which initialises itself.
				note(who+", _initialize", got.initRand)
			case !bytes.Equal(got.initRand, inits[name]):
				t.Fatalf("%s: _initialize's bytes changed between calls of one instance", who)
			}
		}
	}
	// Initialisation: once per module with a snapshot, once per instance
	// without one.
	if !bytes.Equal(inits["snapshot"], inits["snapshot, reset"]) {
		t.Fatalf("two instances from one snapshot read different bytes in _initialize: %x, %x", inits["snapshot"], inits["snapshot, reset"])
	}
	note("the instance without a snapshot, in _initialize", inits["no snapshot"])
	note("the snapshot, in _initialize", inits["snapshot"])
	note("the first instance without a snapshot reset per call, in _initialize", inits["no snapshot, reset"])
}

// TestClockShowsNothingOfTheLastCall: the clocks a guest reads are the
// host's (ABI.md §1.2): the monotonic clock never goes back and advances
// exactly as real time does, however often a guest reads it, so a call
// that reads it 20,000 times leaves no trace in what the next call
// reads; the wall clock reads the host's time. For every kind of
// instance: from a snapshot or not, with reset per call or without.
func TestClockShowsNothingOfTheLastCall(t *testing.T) {
	f := newWasmFixture(t)
	for name, s := range entropySessions(t, f) {
		before := time.Now()
		first := runClock(t, s, 20_000)
		second := runClock(t, s, 0)
		elapsed := time.Since(before)
		// A clock that moved on each read would have advanced by the
		// reads (20 s, at wazero's 1 ms a read), not by real time.
		if d := time.Duration(second.mono - first.mono); d < 0 || d > elapsed {
			t.Errorf("%s: the monotonic clock advanced %v between the calls' first readings, in %v of real time", name, d, elapsed)
		}
		if first.lastMono < first.mono || second.mono < first.lastMono {
			t.Errorf("%s: the monotonic clock went back: %d, %d, then %d", name, first.mono, first.lastMono, second.mono)
		}
		if first.initMono > first.mono {
			t.Errorf("%s: the monotonic clock read %d in _initialize, later %d", name, first.initMono, first.mono)
		}
		after := time.Now()
		for i, wall := range []int64{first.wall, second.wall} {
			// The guest's wall clock has microsecond resolution.
			if w := time.Unix(0, wall); w.Before(before.Add(-time.Microsecond)) || w.After(after) {
				t.Errorf("%s, call %d: the wall clock read %v, outside the call's %v to %v", name, i+1, w, before, after)
			}
		}
	}
}
