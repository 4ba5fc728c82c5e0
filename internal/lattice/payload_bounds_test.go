package lattice_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
)

// waitUntil checks cond until it holds, or fails the test after 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
		<-tick.C
	}
}

// TestAbandonedOutputDeleted: a call whose client goes away while the
// host runs it leaves no object behind: the host stores the 64 KiB
// output and answers after the front gave the call up, and the front
// deletes the object its answer names (the host's own deletion, an hour
// away here, plays no part).
func TestAbandonedOutputDeleted(t *testing.T) {
	url := smallServer(t)
	const lat = "pla"
	m := join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "big_output", "big_output")}, lattice.HostConfig{TTL: ttl})
	lattice.SetOutputKeep(m.h, time.Hour)
	reached, release := make(chan struct{}), make(chan struct{})
	lattice.SetBeforeAnswer(m.h, func() {
		reached <- struct{}{}
		<-release
	})
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := f.Call(ctx, "big_output", nil)
		done <- err
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the host did not store the output within 10s")
	}
	if left := payloadObjects(t, url, lat); len(left) != 1 {
		t.Fatalf("objects in the store while the host answers: %v, want the output's", left)
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not end within 10s of its client going away")
	}
	close(release)
	if lattice.Class(err) != errdefs.ClassClientClosed {
		t.Fatalf("the call: %v, want client_closed", err)
	}
	waitUntil(t, "the front deleted no output", func() bool { return f.Stats().DroppedOutputs == 1 })
	if left := payloadObjects(t, url, lat); len(left) != 0 {
		t.Fatalf("objects left in the payload store after an abandoned call: %v", left)
	}
}

// TestOutputOfAnAnswerNoFrontReads: an output whose answer reached no
// front (here: a client that reads the answer and never the object) is
// deleted by its host OutputKeep after the answer.
func TestOutputOfAnAnswerNoFrontReads(t *testing.T) {
	url := smallServer(t)
	const lat = "plk"
	m := join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "big_output", "big_output")}, lattice.HostConfig{TTL: ttl})
	lattice.SetOutputKeep(m.h, 50*time.Millisecond)
	client := connect(t, url)
	answer, err := client.RequestMsg(nats.NewMsg(lattice.SessionSubject(lat, "big_output")), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	name := answer.Header.Get(lattice.PayloadHeader)
	if name == "" {
		t.Fatalf("the answer names no object: %v", answer.Header)
	}
	js, err := jetstream.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obs, err := js.ObjectStore(ctx, lattice.PayloadsBucket(lat))
	if err != nil {
		t.Fatal(err)
	}
	// GetInfo, not List: a listing that runs as an object is purged can
	// wait for a message no longer there.
	waitUntil(t, "the host left its output in the payload store", func() bool {
		_, err := obs.GetInfo(ctx, name)
		return errors.Is(err, jetstream.ErrObjectNotFound)
	})
}

// TestPayloadStoreMax: the payload store holds at most
// PayloadStoreMax bytes. An input larger than that is refused
// out_of_budget before anything is stored or run; an output that does
// not fit beside the call's input is refused unavailable (503), naming
// the full store; no object is left either way; payloads that fit pass.
func TestPayloadStoreMax(t *testing.T) {
	url := smallServer(t)
	const lat = "plx"
	const limit = 256 << 10
	m := join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "echo", "echo")}, lattice.HostConfig{TTL: ttl, PayloadStoreMax: limit})
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, PayloadStoreMax: limit})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := f.Call(ctx, "echo", make([]byte, 300<<10))
	var le *lattice.Error
	if !errors.As(err, &le) || le.Class != errdefs.ClassOutOfBudget || !strings.Contains(le.Message, "payload_store_max 262144 bytes") ||
		!strings.Contains(le.Message, "307200") {
		t.Fatalf("an input of 300 KiB: %#v", err)
	}
	if n := m.d.Pool("echo").Status().Calls; n != 0 {
		t.Fatalf("the session ran %d calls", n)
	}

	_, err = f.Call(ctx, "echo", make([]byte, 200<<10))
	if !errors.As(err, &le) || le.Class != errdefs.ClassUnavailable || le.Host != "h1" || !strings.Contains(le.Message, "payload store is full") ||
		!strings.Contains(le.Message, "payload_store_max 262144 bytes") {
		t.Fatalf("an echo of 200 KiB (input and output 400 KiB): %#v", err)
	}
	if left := payloadObjects(t, url, lat); len(left) != 0 {
		t.Fatalf("objects left in the payload store: %v", left)
	}

	in := make([]byte, 100<<10)
	if out, err := f.Call(ctx, "echo", in); err != nil || len(out) != len(in) {
		t.Fatalf("an echo of 100 KiB: %d bytes, %v", len(out), err)
	}
	if left := payloadObjects(t, url, lat); len(left) != 0 {
		t.Fatalf("objects left in the payload store: %v", left)
	}
}
