package lattice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
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

// modelKey is a session's key in the models bucket; commitKey the key of
// the revision of it that every live host acknowledged (a JSON
// [SwapCommit]).
func modelKey(session string) string  { return "session." + session }
func commitKey(session string) string { return "commit." + session }

// SwapCommit is the value of a session's commit key: the revision of its
// desired module that every live host that had the session acknowledged,
// written by the front that swapped before it answers. A host whose
// applied revision is lower refuses the session's calls (they run
// nowhere, and are sent again): it missed the swap.
type SwapCommit struct {
	Revision uint64    `json:"revision"`
	SHA256   string    `json:"sha256"`
	At       time.Time `json:"at"`
}

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
	commits map[string]uint64        // by session: the committed revision
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
	m := &models{kv: kv, obs: obs, watcher: w, desired: map[string]DesiredModule{}, commits: map[string]uint64{}, done: make(chan struct{})}
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
		if session, ok := strings.CutPrefix(e.Key(), "commit."); ok {
			var c SwapCommit
			m.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &c) == nil {
				m.commits[session] = c.Revision
			} else {
				delete(m.commits, session)
			}
			m.mu.Unlock()
			m.changed.notify()
			continue
		}
		session, ok := strings.CutPrefix(e.Key(), "session.")
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

// lookup returns the desired module of a session, if the lattice has one.
func (m *models) lookup(session string) (DesiredModule, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dm, ok := m.desired[session]
	return dm, ok
}

// committed is the committed revision of a session's desired module (0:
// none).
func (m *models) committed(session string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits[session]
}

// commit records that every live host acknowledged revision rev of
// session's desired module, and returns once this view shows it.
func (m *models) commit(ctx context.Context, session, sha string, rev uint64) error {
	b, err := json.Marshal(SwapCommit{Revision: rev, SHA256: sha, At: time.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := m.kv.Put(ctx, commitKey(session), b); err != nil {
		return fmt.Errorf("writing session %s's committed revision to the lattice's models bucket: %w", session, err)
	}
	return m.changed.waitFor(ctx, func() bool { return m.committed(session) >= rev })
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
