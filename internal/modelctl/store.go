package modelctl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/fileread"
)

// ModuleRecord is a module version loaded by request (an upload, or a
// load of a path), to be loaded again at a restart.
type ModuleRecord struct {
	Name        string   `json:"name"`
	SHA256      string   `json:"sha256"`
	Kind        string   `json:"kind,omitempty"`
	MemoryLimit *int64   `json:"memory_limit,omitempty"`
	WASI        []string `json:"wasi,omitempty"`
	Snapshot    *bool    `json:"snapshot,omitempty"`
	// Source is how it came: "upload" or "path".
	Source string    `json:"source"`
	At     time.Time `json:"at"`
}

// Request returns the load request of r (its bytes come from the store).
func (r ModuleRecord) Request() deploy.ModuleRequest {
	return deploy.ModuleRequest{Name: r.Name, SHA256: r.SHA256, Kind: r.Kind, MemoryLimit: r.MemoryLimit, WASI: r.WASI, Snapshot: r.Snapshot}
}

// SwapRecord is a session's swap, to be applied again at a restart.
type SwapRecord struct {
	Session string `json:"session"`
	// Stage is the module the session was swapped to, name@sha256.
	Stage string `json:"stage"`
	// ManifestStage is the session's stage module in the manifest when it
	// was swapped, name@sha256: a restart whose manifest gives the session
	// another stage does not apply the swap (the manifest changed since;
	// the newer intent wins), and says so.
	ManifestStage string    `json:"manifest_stage"`
	At            time.Time `json:"at"`
}

// State is the model state a [Store] keeps.
type State struct {
	// Version is the format's, 1.
	Version int `json:"version"`
	// Revision counts the updates: each [Store.Update] adds one.
	Revision uint64         `json:"revision"`
	Modules  []ModuleRecord `json:"modules"`
	Swaps    []SwapRecord   `json:"swaps"`
}

// StateVersion is the version of [State] this package writes and reads.
const StateVersion = 1

// The most a state directory's files may hold when read back: a module
// (runtime.max_module_size's upper bound, 4 GiB: no upload is larger)
// and the state record (a few hundred bytes a session).
const (
	maxBlob  = 4 << 30
	maxState = 16 << 20
)

// Store keeps the model state and the bytes of the modules it names.
// Implementations are safe for concurrent use; one process (the
// supervisor) writes, any number read.
type Store interface {
	// PutBlob stores a module's bytes under their sha256 (lower-case
	// hex); storing the same bytes again is a no-op.
	PutBlob(ctx context.Context, sha256 string, bin []byte) error
	// Blob returns the bytes stored under sha256. Its error wraps
	// errdefs.ErrNotFound when there are none, and is of class
	// errdefs.ErrInvalidArgument when they no longer hash to sha256.
	Blob(ctx context.Context, sha256 string) ([]byte, error)
	// Load returns the state; an empty one when nothing was stored yet.
	Load(ctx context.Context) (State, error)
	// Update changes the state with fn and stores it with its Revision
	// one higher, atomically: a reader sees the state before or after,
	// never a part of it. An error of fn leaves the state as it was.
	Update(ctx context.Context, fn func(*State) error) error
}

// AddModule records m in st, replacing a record of the same name and
// sha256.
func (st *State) AddModule(m ModuleRecord) {
	for i, o := range st.Modules {
		if o.Name == m.Name && o.SHA256 == m.SHA256 {
			st.Modules[i] = m
			return
		}
	}
	st.Modules = append(st.Modules, m)
}

// RemoveModule drops the records of module name, every version when
// sha256 is "", else that one.
func (st *State) RemoveModule(name, sha256 string) {
	out := st.Modules[:0]
	for _, o := range st.Modules {
		if o.Name == name && (sha256 == "" || o.SHA256 == sha256) {
			continue
		}
		out = append(out, o)
	}
	st.Modules = out
}

// SetSwap records a swap of sw.Session, replacing the one before; a swap
// back to the manifest's stage removes the record instead.
func (st *State) SetSwap(sw SwapRecord) {
	out := st.Swaps[:0]
	for _, o := range st.Swaps {
		if o.Session != sw.Session {
			out = append(out, o)
		}
	}
	st.Swaps = out
	if sw.Stage != sw.ManifestStage {
		st.Swaps = append(st.Swaps, sw)
	}
}

// Dir is the on-disk [Store]:
//
//	DIR/state.json              the State (written aside, then renamed)
//	DIR/modules/SHA256.wasm     each module's bytes
//
// It is made on the first write, with mode 0700 (files 0600).
type Dir struct {
	dir string
	mu  sync.Mutex // serialises Update within the process
}

var _ Store = (*Dir)(nil)

var shaRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// OpenDir returns the store in dir (an absolute or relative path; it need
// not exist yet).
func OpenDir(dir string) *Dir { return &Dir{dir: dir} }

// Path is the store's directory.
func (d *Dir) Path() string { return d.dir }

func (d *Dir) blobPath(sum string) (string, error) {
	if !shaRE.MatchString(sum) {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "model state: %q is not a lower-case hex sha256", sum)
	}
	return filepath.Join(d.dir, "modules", sum+".wasm"), nil
}

// PutBlob writes bin to DIR/modules/SHA256.wasm.
func (d *Dir) PutBlob(_ context.Context, sum string, bin []byte) error {
	p, err := d.blobPath(sum)
	if err != nil {
		return err
	}
	if got := hexSHA(bin); got != sum {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "model state: the bytes hash to %s, not %s", got, sum)
	}
	if b, err := fileread.ReadFile(p, maxBlob); err == nil && hexSHA(b) == sum {
		return nil
	}
	return writeAtomic(p, bin)
}

// Blob reads DIR/modules/SHA256.wasm and checks its sha256.
func (d *Dir) Blob(_ context.Context, sum string) ([]byte, error) {
	p, err := d.blobPath(sum)
	if err != nil {
		return nil, err
	}
	b, err := fileread.ReadFile(p, maxBlob)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "model state: %s is missing", p)
	}
	if err != nil {
		return nil, fmt.Errorf("model state: %w", err)
	}
	if got := hexSHA(b); got != sum {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "model state: %s is corrupt: it hashes to %s", p, got)
	}
	return b, nil
}

// Load reads DIR/state.json; an empty State when it does not exist.
func (d *Dir) Load(_ context.Context) (State, error) {
	return d.load()
}

func (d *Dir) load() (State, error) {
	p := filepath.Join(d.dir, "state.json")
	b, err := fileread.ReadFile(p, maxState)
	if errors.Is(err, os.ErrNotExist) {
		return State{Version: StateVersion}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("model state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "model state: %s is not the state's JSON: %v", p, err)
	}
	if st.Version != StateVersion {
		return State{}, errdefs.Errorf(errdefs.ErrUnsupported, "model state: %s has version %d; this stagehost reads version %d", p, st.Version, StateVersion)
	}
	return st, nil
}

// Update reads DIR/state.json, applies fn and writes it back (aside,
// then renamed).
func (d *Dir) Update(_ context.Context, fn func(*State) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.load()
	if err != nil {
		return err
	}
	if err := fn(&st); err != nil {
		return err
	}
	st.Version = StateVersion
	st.Revision++
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(d.dir, "state.json"), append(b, '\n'))
}

func writeAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("model state: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("model state: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("model state: writing %s: %w", p, err)
	}
	return nil
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
