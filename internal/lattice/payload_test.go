package lattice_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/lattice"
)

// smallServer starts an embedded server whose max_payload is 32 KiB.
func smallServer(t *testing.T) string {
	t.Helper()
	srv, err := lattice.StartEmbedded(lattice.EmbeddedConfig{StoreDir: t.TempDir(), MaxPayload: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

// payloadObjects lists the objects left in a lattice's payload store.
func payloadObjects(t *testing.T, url, lat string) []string {
	t.Helper()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obs, err := js.ObjectStore(ctx, lattice.PayloadsBucket(lat))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	return names
}

// TestLargePayloads: on a server whose max_payload is 32 KiB, inputs and
// outputs that one message cannot carry go through the lattice's payload
// store, whole and unchanged: a 1 MiB input echoed back, a 40 KiB input,
// a 64 KiB output. Every object is deleted by the time the call returns.
func TestLargePayloads(t *testing.T) {
	url := smallServer(t)
	join(t, url, "pl", "h1", manifestOpts{extra: moduleSession(t, "echo", "echo") + moduleSession(t, "big_output", "big_output")}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, "pl", lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, n := range []int{0, 1000, 28 << 10, 29 << 10, 1 << 20} {
		in := make([]byte, n)
		for i := range in {
			in[i] = byte(rand.N(256))
		}
		out, err := f.Call(ctx, "echo", in)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("echo of %d bytes: %d bytes back, equal %v, %v", n, len(out), bytes.Equal(out, in), err)
		}
	}
	if out, err := f.Call(ctx, "steady", make([]byte, 40<<10)); err != nil || string(out) != "ok" {
		t.Fatalf("a 40 KiB input: %q %v", out, err)
	}
	out, err := f.Call(ctx, "big_output", nil)
	if err != nil || len(out) != 64<<10 || bytes.Count(out, []byte{0x5A}) != 64<<10 {
		t.Fatalf("a 64 KiB output: %d bytes, %v", len(out), err)
	}
	if left := payloadObjects(t, url, "pl"); len(left) != 0 {
		t.Fatalf("objects left in the payload store: %v", left)
	}
}

// TestLargeInputSentAgain: an input in the payload store outlives the
// host that was handed the call and never acknowledged it: the call is
// sent again, and the host that takes it reads the same object.
func TestLargeInputSentAgain(t *testing.T) {
	url := smallServer(t)
	const lat = "plr"
	join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "echo", "echo")}, lattice.HostConfig{TTL: ttl})
	swallowed := blackHole(t, url, lattice.SessionSubject(lat, "echo"), lattice.QueueGroup(lat, "echo"))
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl, AckTimeout: 20 * time.Millisecond})
	in := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := f.Call(ctx, "echo", in)
		cancel()
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("call %d: %d bytes, %v (stats %+v)", i, len(out), err, f.Stats())
		}
	}
	if swallowed.Load() == 0 {
		t.Fatal("the hole took no call: nothing was sent again")
	}
	if left := payloadObjects(t, url, lat); len(left) != 0 {
		t.Fatalf("objects left in the payload store: %v", left)
	}
}

// TestLargeInputGone: a request naming an object the payload store does
// not have is answered 503 unavailable, naming the object and the store,
// and runs nothing.
func TestLargeInputGone(t *testing.T) {
	url := smallServer(t)
	const lat = "plg"
	m := join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "echo", "echo")}, lattice.HostConfig{TTL: ttl})
	client := connect(t, url)
	req := nats.NewMsg(lattice.SessionSubject(lat, "echo"))
	req.Header.Set(lattice.PayloadHeader, "NOSUCHOBJECT")
	answer, err := client.RequestMsg(req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if answer.Header.Get(micro.ErrorCodeHeader) != "503" || answer.Header.Get(lattice.ClassHeader) != errdefs.ClassUnavailable ||
		!strings.Contains(string(answer.Data), "NOSUCHOBJECT") || !strings.Contains(string(answer.Data), "payload store") {
		t.Fatalf("answer %v %s", answer.Header, answer.Data)
	}
	if n := m.d.Pool("echo").Status().Calls; n != 0 {
		t.Fatalf("the session ran %d calls", n)
	}
}

// TestMaxInputOnTheHost: the host that runs a call applies its
// session's max_input, whoever sent the call (a front that does not
// know the session's spec applies only the default): an input over it,
// in the message or in the payload store, is refused out_of_budget
// naming the limit and the host, the session runs nothing, and the
// stored input is deleted all the same.
func TestMaxInputOnTheHost(t *testing.T) {
	url := smallServer(t)
	const lat = "plm"
	m := join(t, url, lat, "h1", manifestOpts{extra: moduleSession(t, "echo", "echo") + "max_input = \"1KiB\"\n"}, lattice.HostConfig{TTL: ttl})
	f := newFront(t, url, lat, lattice.FrontConfig{TTL: ttl})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := f.Call(ctx, "echo", make([]byte, 1024)); err != nil || len(out) != 1024 {
		t.Fatalf("1 KiB: %d bytes, %v", len(out), err)
	}
	for _, n := range []int{1025, 64 << 10} {
		_, err := f.Call(ctx, "echo", make([]byte, n))
		var le *lattice.Error
		if !errors.As(err, &le) || le.Class != errdefs.ClassOutOfBudget || le.Host != "h1" ||
			!strings.Contains(le.Message, `session "echo"'s max_input of 1024 bytes`) || !strings.Contains(le.Message, strconv.Itoa(n)) {
			t.Fatalf("%d bytes: %#v", n, err)
		}
	}
	if n := m.d.Pool("echo").Status().Calls; n != 1 {
		t.Fatalf("the session ran %d calls, want 1", n)
	}
	if left := payloadObjects(t, url, lat); len(left) != 0 {
		t.Fatalf("objects left in the payload store: %v", left)
	}
}
