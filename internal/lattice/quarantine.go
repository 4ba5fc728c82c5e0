package lattice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Poison is one module in a lattice's shared quarantine.
type Poison struct {
	SHA256  string    `json:"sha256"`
	Reason  string    `json:"reason"`
	Host    string    `json:"host,omitempty"`    // the host that quarantined it
	Session string    `json:"session,omitempty"` // the session it ran in there
	At      time.Time `json:"at"`
}

// Quarantine is a lattice's shared quarantine: a KV bucket of poisoned
// module sha256s (QuarantineBucket, key = the sha256, value = a JSON
// [Poison]). Every host refuses calls to a session whose stage or fence
// module is in it. Entries stay until cleared. It keeps a watched copy of
// the bucket, so lookups cost no round trip.
type Quarantine struct {
	kv      jetstream.KeyValue
	watcher jetstream.KeyWatcher
	mu      sync.Mutex
	set     map[string]Poison
	changed notifier
	done    chan struct{}
}

// OpenQuarantine opens (creating it if needed) a lattice's shared
// quarantine and loads it.
func OpenQuarantine(ctx context.Context, js jetstream.JetStream, lattice string, replicas int) (*Quarantine, error) {
	if err := checkName("lattice", lattice); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: QuarantineBucket(lattice), Description: "stagehost lattice " + lattice + ": quarantined module sha256s",
		History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: quarantine bucket: %w", err)
	}
	w, err := kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("lattice: watching the quarantine bucket: %w", err)
	}
	q := &Quarantine{kv: kv, watcher: w, set: map[string]Poison{}, done: make(chan struct{})}
	loaded := make(chan struct{})
	go q.watch(loaded)
	select {
	case <-loaded:
		return q, nil
	case <-ctx.Done():
		_ = w.Stop()
		return nil, ctx.Err()
	}
}

func (q *Quarantine) watch(loaded chan struct{}) {
	defer close(q.done)
	for e := range q.watcher.Updates() {
		if e == nil { // the initial values are in
			close(loaded)
			continue
		}
		q.mu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			var p Poison
			if json.Unmarshal(e.Value(), &p) == nil {
				p.SHA256 = e.Key()
				q.set[e.Key()] = p
			}
		} else {
			delete(q.set, e.Key())
		}
		q.mu.Unlock()
		q.changed.notify()
	}
}

// Poison puts a module in the quarantine. The first reason recorded wins:
// poisoning a module already in it changes nothing. It returns once this
// view has the module too (read your writes: a host that quarantines a
// module refuses the very next call to it), or when ctx ends.
func (q *Quarantine) Poison(ctx context.Context, p Poison) error {
	if p.At.IsZero() {
		p.At = time.Now().UTC()
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := q.kv.Create(ctx, p.SHA256, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("lattice: quarantining module %s: %w", p.SHA256, err)
	}
	if err := q.WaitFor(ctx, func() bool { _, ok := q.Lookup(p.SHA256); return ok }); err != nil {
		return fmt.Errorf("lattice: quarantined module %s, but this host's view did not show it: %w", p.SHA256, err)
	}
	return nil
}

// TenantKey is the shared quarantine's key of a tenant (manifest
// [[tenant]]): every host refuses calls to the tenant's sessions while
// it is there, as for a poisoned module. A module's key is its sha256
// (64 hex digits), so the two never meet.
func TenantKey(tenant string) string { return "tenant." + tenant }

// Lookup says whether a module is quarantined, and why.
func (q *Quarantine) Lookup(sha256 string) (Poison, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, ok := q.set[sha256]
	return p, ok
}

// Get reads whether a module is quarantined from the bucket itself, not
// this view (a round trip: for a decision that must not miss a poison
// the view has not seen yet, such as a swap).
func (q *Quarantine) Get(ctx context.Context, sha256 string) (Poison, bool, error) {
	e, err := q.kv.Get(ctx, sha256)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Poison{}, false, nil
	}
	if err != nil {
		return Poison{}, false, fmt.Errorf("lattice: reading the quarantine bucket: %w", err)
	}
	var p Poison
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return Poison{}, false, fmt.Errorf("lattice: quarantine entry %s: %w", sha256, err)
	}
	p.SHA256 = sha256
	return p, true, nil
}

// List lists the quarantined modules, sorted by sha256.
func (q *Quarantine) List() []Poison {
	q.mu.Lock()
	out := make([]Poison, 0, len(q.set))
	for _, p := range q.set {
		out = append(out, p)
	}
	q.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].SHA256 < out[j].SHA256 })
	return out
}

// Clear takes a module out of the quarantine (every host serves it again).
func (q *Quarantine) Clear(ctx context.Context, sha256 string) error {
	if err := q.kv.Purge(ctx, sha256); err != nil {
		return fmt.Errorf("lattice: clearing module %s: %w", sha256, err)
	}
	return nil
}

// WaitFor waits until cond holds, checking it after every change to the
// quarantine, or until ctx ends.
func (q *Quarantine) WaitFor(ctx context.Context, cond func() bool) error {
	return q.changed.waitFor(ctx, cond)
}

// Close stops watching.
func (q *Quarantine) Close() error {
	err := q.watcher.Stop()
	<-q.done
	return err
}

// refusal is the error of a call to a session whose module is quarantined.
func refusal(host string, p Poison) *Error {
	if tenant, ok := strings.CutPrefix(p.SHA256, TenantKey("")); ok {
		return unavailable(host, "tenant %s is quarantined lattice-wide: %s", tenant, p.Reason)
	}
	return unavailable(host, "module %s is quarantined lattice-wide: %s", p.SHA256, p.Reason)
}
