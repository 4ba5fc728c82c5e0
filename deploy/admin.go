package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/stages"
)

// Model control: load versions of modules, swap a session's instances to
// another version with a drain, unload a module no session uses, and
// reset a session's out-of-service instances. The HTTP routes are in
// admin_http.go; docs/service.md ("Model control") describes them.
//
// Every operation holds the deployment's admin lock, so they run one at a
// time; calls keep running meanwhile.

// adminState is the deployment's model-control state.
type adminState struct {
	mu       sync.Mutex                  // serialises load, swap, unload and reset
	versions map[string][]*moduleVersion // by module name, in load order: the last is the newest
}

// moduleVersion is one loaded version of a named module.
type moduleVersion struct {
	mod      *stages.Module
	bin      []byte // the module's bytes, kept so that a lattice can publish them ([Deployment.ModuleBytes])
	size     int64
	spec     loadSpec
	source   string // "manifest", "path" or "upload"
	loadedAt time.Time
}

// loadSpec is what a module is loaded with besides its bytes: what the
// manifest's [[module]] table would give it.
type loadSpec struct {
	kind        stages.ModuleKind
	memoryLimit int64 // bytes
	maxSize     int64 // bytes
	wasi        []string
	snapshot    bool
}

func (l loadSpec) config(name string) stages.LoadConfig {
	return stages.NewLoadConfig().WithName(name).WithKind(l.kind).WithMemoryLimit(l.memoryLimit).
		WithMaxSize(l.maxSize).WithWASI(l.wasi...).WithSnapshot(l.snapshot)
}

// registerModule records a module the manifest loaded.
func (d *Deployment) registerModule(mm *manifest.Module, mod *stages.Module) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	if d.admin.versions == nil {
		d.admin.versions = map[string][]*moduleVersion{}
	}
	d.admin.versions[mm.Name] = append(d.admin.versions[mm.Name], &moduleVersion{mod: mod, bin: mm.Bytes, size: int64(len(mm.Bytes)),
		spec:   loadSpec{kind: mm.Kind, memoryLimit: mm.MemoryLimit, maxSize: mm.MaxSize, wasi: mm.WASI, snapshot: mm.Snapshot},
		source: "manifest", loadedAt: time.Now()})
}

// ModuleInfo describes one loaded version of a module.
type ModuleInfo struct {
	Name        string    `json:"name"`
	SHA256      string    `json:"sha256"`
	Ref         string    `json:"ref"` // name@sha256, for swap and unload
	Kind        string    `json:"kind"`
	Size        int64     `json:"size_bytes"`
	MemoryLimit int64     `json:"memory_limit_bytes"`
	WASI        []string  `json:"wasi"`
	Snapshot    bool      `json:"snapshot"`
	Newest      bool      `json:"newest"` // the version a bare name refers to
	Source      string    `json:"source"` // manifest, path or upload
	LoadedAt    time.Time `json:"loaded_at"`
	// Sessions lists the sessions whose current instances use it (as
	// their stage or fence module), or whose replaced instances still
	// finish a call on it.
	Sessions []string `json:"sessions"`
}

// ModuleRequest is a module to load: its name, the sha256 its bytes must
// have, and optionally how to load it. An option left out is the newest
// loaded version's of that name, or the manifest's default.
type ModuleRequest struct {
	Name        string   `json:"name"`
	Path        string   `json:"path,omitempty"` // a file on the server's machine (POST /v1/modules)
	SHA256      string   `json:"sha256"`
	Kind        string   `json:"kind,omitempty"` // "stage" or "fence"
	MemoryLimit *int64   `json:"memory_limit,omitempty"`
	WASI        []string `json:"wasi,omitempty"`
	Snapshot    *bool    `json:"snapshot,omitempty"`
}

var moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// ValidModuleName accepts a module name a request may load: 1 to 64 of
// A-Z a-z 0-9 _ . - (not starting with . or -).
func ValidModuleName(name string) bool { return moduleNameRE.MatchString(name) }

const (
	wasmPage       = 64 << 10
	maxMemoryLimit = 4 << 30
)

// loadSpecFor returns how a module of req's name is to be loaded. Called
// under the admin lock.
func (d *Deployment) loadSpecFor(req ModuleRequest) (loadSpec, error) {
	if !moduleNameRE.MatchString(req.Name) {
		return loadSpec{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "module name %q: want 1 to 64 of A-Z a-z 0-9 _ . - (not starting with . or -)", req.Name)
	}
	spec := loadSpec{kind: stages.StageModule, memoryLimit: 64 << 20, maxSize: d.Manifest.Runtime.MaxModuleSize, snapshot: true}
	if vs := d.admin.versions[req.Name]; len(vs) > 0 {
		spec = vs[len(vs)-1].spec
	}
	if spec.maxSize <= 0 {
		spec.maxSize = stages.DefaultMaxModuleSize
	}
	switch req.Kind {
	case "":
	case "stage":
		spec.kind = stages.StageModule
	case "fence":
		spec.kind = stages.FenceModule
	default:
		return loadSpec{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "kind %q: want stage or fence", req.Kind)
	}
	if req.MemoryLimit != nil {
		if n := *req.MemoryLimit; n <= 0 || n%wasmPage != 0 || n > maxMemoryLimit {
			return loadSpec{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "memory_limit %d: want a positive multiple of 65536 bytes, at most 4GiB", n)
		}
		spec.memoryLimit = *req.MemoryLimit
	}
	if req.WASI != nil {
		spec.wasi = req.WASI
	}
	if req.Snapshot != nil {
		spec.snapshot = *req.Snapshot
	}
	return spec, nil
}

// MaxModuleSize is the largest module the deployment loads by request
// (runtime.max_module_size, or a larger max_size of the module's
// manifest entry).
func (d *Deployment) MaxModuleSize(name string) int64 {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	spec, err := d.loadSpecFor(ModuleRequest{Name: name})
	if err != nil {
		return max(d.Manifest.Runtime.MaxModuleSize, 1)
	}
	return spec.maxSize
}

// ReadModuleFile reads a module file named by a request: a path relative
// to the manifest's directory, or absolute. Like every file a manifest
// names, it must be a regular file within the size limit.
func (d *Deployment) ReadModuleFile(name, path string) ([]byte, error) {
	if path == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "no path given")
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(d.Manifest.Dir, path)
	}
	b, err := manifest.ReadFile(path, d.MaxModuleSize(name))
	if err != nil {
		class := errdefs.ErrInvalidArgument
		if errors.Is(err, manifest.ErrTooLarge) {
			class = errdefs.ErrOutOfBudget
		}
		return nil, errdefs.Errorf(class, "module %q: %v", name, err)
	}
	return b, nil
}

// LoadModule loads bin as a version of module req.Name; its sha256 must
// be req.SHA256. It reports whether the version is new (the same name
// and bytes loaded again is the version already there).
//
// # Errors
//
// [errdefs.ErrInvalidArgument]: a bad name or option, a sha256 mismatch, a
// module that does not validate or compile (as [stages.Engine.Load]);
// [errdefs.ErrOutOfBudget]: bin is larger than the size limit.
func (d *Deployment) LoadModule(ctx context.Context, req ModuleRequest, bin []byte, source string) (ModuleInfo, bool, error) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	spec, err := d.loadSpecFor(req)
	if err != nil {
		return ModuleInfo{}, false, err
	}
	if int64(len(bin)) > spec.maxSize {
		return ModuleInfo{}, false, errdefs.Errorf(errdefs.ErrOutOfBudget, "module %q: %d bytes, above the size limit of %d bytes", req.Name, len(bin), spec.maxSize)
	}
	if req.SHA256 == "" {
		return ModuleInfo{}, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: no sha256 given (the bytes hash to %s)", req.Name, stages.SHA256(bin))
	}
	sum := stages.SHA256(bin)
	for _, v := range d.admin.versions[req.Name] {
		if v.mod.SHA256() == sum && strings.EqualFold(req.SHA256, sum) {
			return d.infoLocked(req.Name, v), false, nil
		}
	}
	mod, err := d.Engine.Load(ctx, bin, req.SHA256, spec.config(req.Name))
	if err != nil {
		return ModuleInfo{}, false, err
	}
	if err := d.checkLoadRequires(req.Name, mod, spec); err != nil {
		if !d.engineHas(mod) {
			_ = mod.Close(ctx)
		}
		return ModuleInfo{}, false, err
	}
	if d.admin.versions == nil {
		d.admin.versions = map[string][]*moduleVersion{}
	}
	v := &moduleVersion{mod: mod, bin: bin, size: int64(len(bin)), spec: spec, source: source, loadedAt: time.Now()}
	d.admin.versions[req.Name] = append(d.admin.versions[req.Name], v)
	d.logger.Info("module loaded", "module", req.Name, "sha256", sum, "source", source, "bytes", len(bin))
	return d.infoLocked(req.Name, v), true, nil
}

// checkLoadRequires checks the declared requirements (abi/ABI.md §7) of
// mod, loaded as name with spec, where a load meets them: the host's
// revision and the load's WASI grants, and each session whose manifest
// stage is name (the sessions a new version of it is for). One error
// lists every session's missing items.
func (d *Deployment) checkLoadRequires(name string, mod *stages.Module, spec loadSpec) error {
	r := mod.Requires()
	if r == nil {
		return nil
	}
	if err := r.Check(name, abi.Offer{WASI: spec.wasi}); err != nil {
		return err
	}
	var errs []string
	for i := range d.Manifest.Sessions {
		ms := &d.Manifest.Sessions[i]
		if ms.Stage != name {
			continue
		}
		if err := r.Check(name, ms.Offer(spec.wasi)); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s (a session whose stage is %q would refuse it at a swap)", strings.Join(errs, "; and "), name)
}

// engineHas reports whether a loaded version is mod (the engine returns
// the same *Module for the same bytes and configuration).
func (d *Deployment) engineHas(mod *stages.Module) bool {
	for _, vs := range d.admin.versions {
		for _, v := range vs {
			if v.mod == mod {
				return true
			}
		}
	}
	return false
}

// Modules lists the loaded module versions, by name, then load order.
func (d *Deployment) Modules() []ModuleInfo {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	names := make([]string, 0, len(d.admin.versions))
	for name := range d.admin.versions {
		names = append(names, name)
	}
	sort.Strings(names)
	out := []ModuleInfo{}
	for _, name := range names {
		for _, v := range d.admin.versions[name] {
			out = append(out, d.infoLocked(name, v))
		}
	}
	return out
}

func (d *Deployment) infoLocked(name string, v *moduleVersion) ModuleInfo {
	vs := d.admin.versions[name]
	snap, _ := v.mod.Snapshot()
	return ModuleInfo{Name: name, SHA256: v.mod.SHA256(), Ref: name + "@" + v.mod.SHA256(), Kind: v.mod.Kind().String(),
		Size: v.size, MemoryLimit: v.spec.memoryLimit, WASI: append([]string{}, v.spec.wasi...), Snapshot: snap,
		Newest: len(vs) > 0 && vs[len(vs)-1] == v, Source: v.source, LoadedAt: v.loadedAt, Sessions: d.usersOf(v.mod)}
}

// usersOf lists the sessions that use mod: as the stage or fence module
// of their current instances (or of their next try, for a failed
// session), or as the module of a replaced instance still finishing its
// call.
func (d *Deployment) usersOf(mod *stages.Module) []string {
	users := []string{}
	for _, name := range d.SessionNames() {
		s := d.sessions[name]
		s.mu.Lock()
		uses := s.stage == mod || s.fence == mod
		p := s.pool
		s.mu.Unlock()
		if !uses && p != nil {
			for _, m := range p.drainingMembers() {
				uses = uses || m.val.stage == mod
			}
		}
		if uses {
			users = append(users, name)
		}
	}
	return users
}

// resolveLocked finds the versions ref names: "name" (every version, the
// newest last) or "name@SHA256" (one version; a unique prefix of the
// sha256 of at least 8 digits will do). Called under the admin lock.
func (d *Deployment) resolveLocked(ref string) (string, []*moduleVersion, error) {
	name, sum, hasSum := strings.Cut(ref, "@")
	vs := d.admin.versions[name]
	if len(vs) == 0 {
		return "", nil, errdefs.Errorf(errdefs.ErrNotFound, "no module %q is loaded", name)
	}
	if !hasSum {
		return name, vs, nil
	}
	if len(sum) < 8 {
		return "", nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: the sha256 after @ needs at least 8 hex digits", ref)
	}
	var found []*moduleVersion
	for _, v := range vs {
		if strings.HasPrefix(v.mod.SHA256(), strings.ToLower(sum)) {
			found = append(found, v)
		}
	}
	switch len(found) {
	case 0:
		return "", nil, errdefs.Errorf(errdefs.ErrNotFound, "module %q has no loaded version %s", name, sum)
	case 1:
		return name, found, nil
	}
	return "", nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %q: %s is the prefix of %d versions' sha256", name, sum, len(found))
}

// UnloadModule closes the versions ref names ("name": every version;
// "name@SHA256": one) and forgets them. It refuses, changing nothing,
// while a session uses one of them.
//
// # Errors
//
// [errdefs.ErrNotFound] for an unknown module or version; an error of class
// invalid_argument (400) naming the sessions that use it.
func (d *Deployment) UnloadModule(ctx context.Context, ref string) ([]ModuleInfo, error) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	name, vs, err := d.resolveLocked(ref)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		if users := d.usersOf(v.mod); len(users) > 0 {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"module %s@%s is in use by session %s: swap the session to another module first",
				name, v.mod.SHA256(), strings.Join(users, ", "))
		}
	}
	var out []ModuleInfo
	var errs []error
	for _, v := range vs {
		out = append(out, d.infoLocked(name, v))
		errs = append(errs, v.mod.Close(ctx))
		keep := d.admin.versions[name][:0]
		for _, w := range d.admin.versions[name] {
			if w != v {
				keep = append(keep, w)
			}
		}
		d.admin.versions[name] = keep
		if d.modules[name] == v.mod {
			delete(d.modules, name)
		}
		d.logger.Info("module unloaded", "module", name, "sha256", v.mod.SHA256())
	}
	if len(d.admin.versions[name]) == 0 {
		delete(d.admin.versions, name)
	}
	return out, errors.Join(errs...)
}

// ModuleBytes returns the module version ref names ("name": its newest
// version; "name@SHA256") and its bytes, which the caller must not
// modify: what a lattice publishes for its other hosts to load
// (docs/lattice.md, "Model control in a lattice").
//
// # Errors
//
// [errdefs.ErrNotFound] for an unknown module or version;
// [errdefs.ErrInvalidArgument] for an ambiguous sha256 prefix.
func (d *Deployment) ModuleBytes(ref string) (ModuleInfo, []byte, error) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	name, vs, err := d.resolveLocked(ref)
	if err != nil {
		return ModuleInfo{}, nil, err
	}
	v := vs[len(vs)-1]
	return d.infoLocked(name, v), v.bin, nil
}

// SwapResult is the answer of a swap.
type SwapResult struct {
	Session        string        `json:"session"`
	From           string        `json:"from"` // name@sha256 of the previous stage module
	To             string        `json:"to"`
	Swapped        bool          `json:"swapped"`  // false when the session already ran that version
	Draining       int           `json:"draining"` // replaced instances still finishing a call
	Status         SessionStatus `json:"status"`
	previousModule *stages.Module
}

// SwapSession moves session name to the stage module ref ("name": its
// newest version; "name@SHA256"): it makes as many new instances as the
// session has, on the same devices, and only when all were made does it
// swap them in: new calls go to the new instances, calls in flight finish
// on the old ones, each old instance is closed once its call is done (a
// quarantined one is kept, never closed). When an instance cannot be
// made, the session keeps its old instances and the error is returned. A
// session that could not be created at start-up is created from ref.
//
// # Errors
//
// [errdefs.ErrNotFound] for an unknown session or module; [errdefs.ErrInvalidArgument]
// for a fence module; the error of an instance's creation.
func (d *Deployment) SwapSession(ctx context.Context, name, ref string) (SwapResult, error) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	s := d.sessions[name]
	if s == nil {
		return SwapResult{}, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", name)
	}
	modName, vs, err := d.resolveLocked(ref)
	if err != nil {
		return SwapResult{}, err
	}
	v := vs[len(vs)-1]
	if v.mod.Kind() != stages.StageModule {
		return SwapResult{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %s@%s is a %s module, not a stage module", modName, v.mod.SHA256(), v.mod.Kind())
	}
	// The module's declared requirements (abi/ABI.md §7), before an
	// instance is made: one error listing every missing item.
	if err := v.mod.Requires().Check(modName, s.Spec.Offer(v.spec.wasi)); err != nil {
		return SwapResult{}, fmt.Errorf("session %q keeps its module: %w", name, err)
	}
	s.mu.Lock()
	old, p := s.stage, s.pool
	s.mu.Unlock()
	res := SwapResult{Session: name, To: modName + "@" + v.mod.SHA256(), previousModule: old}
	if old != nil {
		res.From = old.Name() + "@" + old.SHA256()
	}
	if old == v.mod && p != nil {
		res.Status = s.Status()
		return res, nil
	}
	var devs []string
	if p != nil {
		for _, m := range p.members() {
			devs = append(devs, m.device)
		}
	} else {
		devs = s.slotDevices()
	}
	insts, err := s.makeInstances(ctx, v.mod, devs)
	if err != nil {
		return SwapResult{}, fmt.Errorf("session %q keeps %s: the new instances could not be made: %w", name, res.From, err)
	}
	s.mu.Lock()
	s.stage = v.mod
	s.mu.Unlock()
	if p != nil {
		p.replaceAll(insts, devs)
	} else {
		s.setPool(insts, devs)
	}
	res.Swapped = true
	res.Status = s.Status()
	res.Draining = res.Status.Draining
	d.logger.Info("session swapped", "session", name, "from", res.From, "to", res.To, "draining", res.Draining)
	return res, nil
}

// slotDevices returns the device of each instance slot, as at start-up:
// the session's devices in turn, or with [Config.WithDevice] only the slots
// on that device.
func (s *Pool) slotDevices() []string {
	n := max(s.Spec.Instances, 1)
	devs := make([]string, 0, n)
	for i := range n {
		if dev := s.Spec.Devices[i%len(s.Spec.Devices)]; s.d.device == "" || dev == s.d.device {
			devs = append(devs, dev)
		}
	}
	return devs
}

// ResetResult is the answer of a reset.
type ResetResult struct {
	Session  string          `json:"session"`
	Replaced []ResetInstance `json:"replaced"` // the instances replaced by fresh ones
	Skipped  []ResetInstance `json:"skipped"`  // those that could not be (Reason says why)
	Status   SessionStatus   `json:"status"`
}

// ResetInstance is one instance a reset replaced or skipped.
type ResetInstance struct {
	Index      int    `json:"index"`
	Device     string `json:"device"`      // the fresh instance's device (skipped: the old one's)
	FromDevice string `json:"from_device"` // the replaced instance's device
	Reason     string `json:"reason"`      // why it was out of service; for a skipped one, why it stays
}

// healthyDevice returns want when it is healthy, else the first healthy
// device of the session's, else "" and want's error.
func (s *Pool) healthyDevice(want string) (string, error) {
	err := s.d.DeviceErr(want)
	if err == nil {
		return want, nil
	}
	for _, dev := range s.Spec.Devices {
		if s.d.DeviceErr(dev) == nil {
			return dev, nil
		}
	}
	return "", fmt.Errorf("no healthy device: %w", err)
}

// ResetSession replaces each quarantined or failed instance of session
// name by a fresh one (a fresh owner), of the session's current stage
// module, on its device if that is healthy, else on another healthy
// device of the session's; an instance with no healthy device left is
// skipped. A quarantined instance is never closed: it keeps its resources,
// counted, and is listed in the status's instances_retired. A session
// that could not be created at start-up is created anew.
//
// # Errors
//
// [errdefs.ErrNotFound] for an unknown session; when an instance could not be
// made (the others are replaced) or no instance could be, the error of
// the first one. The result is valid even then.
func (d *Deployment) ResetSession(ctx context.Context, name string) (ResetResult, error) {
	d.admin.mu.Lock()
	defer d.admin.mu.Unlock()
	s := d.sessions[name]
	if s == nil {
		return ResetResult{}, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", name)
	}
	res := ResetResult{Session: name, Replaced: []ResetInstance{}, Skipped: []ResetInstance{}}
	s.mu.Lock()
	p, failed, stage := s.pool, s.failed, s.stage
	s.mu.Unlock()
	if p == nil {
		if stage == nil {
			res.Status = s.Status()
			return res, errdefs.Errorf(errdefs.ErrNotFound, "session %q: its stage module %q is not loaded", name, s.Spec.Stage)
		}
		slots := s.slotDevices()
		devs := make([]string, len(slots))
		for i, want := range slots {
			dev, err := s.healthyDevice(want)
			if err != nil {
				res.Status = s.Status()
				return res, errdefs.Errorf(errdefs.ErrDeviceLost, "session %q could not be created: instance %d: %v", name, i, err)
			}
			devs[i] = dev
		}
		insts, err := s.makeInstances(ctx, stage, devs)
		if err != nil {
			s.mu.Lock()
			s.failed = err
			s.mu.Unlock()
			res.Status = s.Status()
			return res, fmt.Errorf("session %q could not be created: %w", name, err)
		}
		s.setPool(insts, devs)
		for i := range devs {
			res.Replaced = append(res.Replaced, ResetInstance{Index: i, Device: devs[i], FromDevice: slots[i], Reason: PublicMessage(failed)})
		}
		res.Status = s.Status()
		d.logger.Info("session reset: created", "session", name)
		return res, nil
	}
	members := p.members()
	var first error
	made := false
	for _, m := range members {
		why := instanceDown(m.val)
		if why == nil {
			continue
		}
		ri := ResetInstance{Index: m.index, Device: m.device, FromDevice: m.device, Reason: PublicMessage(why)}
		dev, err := s.healthyDevice(m.device)
		if err == nil {
			var in *instance
			if in, err = s.makeInstance(ctx, stage, m.index, len(members), dev); err == nil {
				made = true
				p.replaceAt(m.index, in, dev)
				ri.Device = dev
				res.Replaced = append(res.Replaced, ri)
				continue
			}
		}
		ri.Reason = fmt.Sprintf("not replaced: %v (out of service: %s)", PublicMessage(err), ri.Reason)
		res.Skipped = append(res.Skipped, ri)
		if first == nil {
			first = fmt.Errorf("session %q: instance %d: %w", name, m.index, err)
		}
	}
	if made {
		s.gen++ // the next instances' owners are named apart from these
	}
	res.Status = s.Status()
	d.logger.Info("session reset", "session", name, "replaced", len(res.Replaced), "skipped", len(res.Skipped))
	return res, first
}
