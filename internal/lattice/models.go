package lattice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehost/stagehost/stages"
)

// ModelsBucket names a lattice's KV bucket of desired modules: key
// "session.<session>", value a [DesiredModule] as JSON, its revision the
// swap's. ModulesStore names the JetStream object store that holds the
// modules' bytes, by sha256.
func ModelsBucket(lattice string) string { return "stagehost-" + lattice + "-models" }

// ModulesStore: see [ModelsBucket].
func ModulesStore(lattice string) string { return "stagehost-" + lattice + "-modules" }

// modelKey is a session's key in the models bucket.
func modelKey(session string) string { return "session." + session }

// DesiredModule is the stage module a lattice-wide swap asks every host
// that has the session to run: the value of the session's key in the
// models bucket. Its KV revision numbers the swap; a host acknowledges
// it in its heartbeat (SessionCapacity.ModelRevision) once its instances
// run the module and the calls on the old ones have ended.
type DesiredModule struct {
	Session string `json:"session"`
	// Module and SHA256 name the module: a host loads the bytes stored
	// under SHA256 in the modules store as a version of Module.
	Module string `json:"module"`
	SHA256 string `json:"sha256"`
	// MemoryLimit, WASI and Snapshot are what the swapping host loaded
	// the module with; every host loads it with them.
	MemoryLimit int64    `json:"memory_limit_bytes"`
	WASI        []string `json:"wasi,omitempty"`
	Snapshot    bool     `json:"snapshot"`
	// By names the member that asked for the swap; At is when.
	By string    `json:"by,omitempty"`
	At time.Time `json:"at"`
	// Revision is the record's KV revision (filled in when read).
	Revision uint64 `json:"revision,omitempty"`
}

// maxStoredModule bounds a module read from the modules store.
const maxStoredModule = 1 << 30

// models is a lattice's desired modules and module store, as one member
// sees them: a watched copy of the models bucket, so lookups cost no
// round trip.
type models struct {
	kv      jetstream.KeyValue
	obs     jetstream.ObjectStore
	watcher jetstream.KeyWatcher
	mu      sync.Mutex
	desired map[string]DesiredModule // by session
	changed notifier
	done    chan struct{}
}

// openModels opens (creating them if needed) the models bucket and the
// modules store, and loads the bucket.
func openModels(ctx context.Context, js jetstream.JetStream, lattice string, replicas int) (*models, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: ModelsBucket(lattice), Description: "stagehost lattice " + lattice + ": the stage module each session runs lattice-wide",
		History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: models bucket: %w", err)
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: ModulesStore(lattice), Description: "stagehost lattice " + lattice + ": module bytes by sha256",
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: modules store: %w", err)
	}
	w, err := kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("lattice: watching the models bucket: %w", err)
	}
	m := &models{kv: kv, obs: obs, watcher: w, desired: map[string]DesiredModule{}, done: make(chan struct{})}
	loaded := make(chan struct{})
	go m.watch(loaded)
	select {
	case <-loaded:
		return m, nil
	case <-ctx.Done():
		_ = w.Stop()
		<-m.done
		return nil, ctx.Err()
	}
}

func (m *models) watch(loaded chan struct{}) {
	defer close(m.done)
	once := false
	for e := range m.watcher.Updates() {
		if e == nil {
			if !once {
				once = true
				close(loaded)
			}
			continue
		}
		session, ok := cutPrefix(e.Key(), "session.")
		if !ok {
			continue
		}
		m.mu.Lock()
		var dm DesiredModule
		if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &dm) == nil {
			dm.Session, dm.Revision = session, e.Revision()
			m.desired[session] = dm
		} else {
			delete(m.desired, session)
		}
		m.mu.Unlock()
		m.changed.notify()
	}
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

// lookup returns the desired module of a session, if the lattice has one.
func (m *models) lookup(session string) (DesiredModule, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dm, ok := m.desired[session]
	return dm, ok
}

// publish stores bin under its sha256 in the modules store (unless it is
// there already) and then dm as the session's desired module; it returns
// the record's revision once this view shows it.
func (m *models) publish(ctx context.Context, dm DesiredModule, bin []byte) (uint64, error) {
	if info, err := m.obs.GetInfo(ctx, dm.SHA256); err != nil || info.Size != uint64(len(bin)) {
		if _, err := m.obs.Put(ctx, jetstream.ObjectMeta{Name: dm.SHA256}, bytes.NewReader(bin)); err != nil {
			return 0, fmt.Errorf("storing module %s@%s in the lattice's modules store: %w", dm.Module, dm.SHA256, err)
		}
	}
	dm.Revision = 0
	b, err := json.Marshal(dm)
	if err != nil {
		return 0, err
	}
	rev, err := m.kv.Put(ctx, modelKey(dm.Session), b)
	if err != nil {
		return 0, fmt.Errorf("writing session %s's desired module to the lattice's models bucket: %w", dm.Session, err)
	}
	err = m.changed.waitFor(ctx, func() bool {
		cur, ok := m.lookup(dm.Session)
		return ok && cur.Revision >= rev
	})
	return rev, err
}

// fetch reads a module's bytes from the modules store and checks their
// sha256.
func (m *models) fetch(ctx context.Context, sha string) ([]byte, error) {
	r, err := m.obs.Get(ctx, sha)
	if err != nil {
		return nil, fmt.Errorf("reading module %s from the lattice's modules store: %w", sha, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxStoredModule+1))
	if err != nil {
		return nil, fmt.Errorf("reading module %s from the lattice's modules store: %w", sha, err)
	}
	if got := stages.SHA256(b); got != sha {
		return nil, errors.New("module " + sha + " in the lattice's modules store hashes to " + got)
	}
	return b, nil
}

// close stops watching.
func (m *models) close() error {
	err := m.watcher.Stop()
	<-m.done
	return err
}
