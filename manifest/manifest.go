// Package manifest reads host.toml, the file in which operators describe a
// whole stagehost deployment: the runtime, the devices, the stage and fence
// modules, and the native and resident sessions wired from them.
//
// Reading is strict and complete. The TOML must be valid, every key must
// be known, every value must have the right type and range, every name
// must resolve, every budget must fit, and every module file must exist,
// match its declared sha256 and pass the module checks of
// [stages.Validate]. Nothing is instantiated or compiled. All problems are
// reported together, as an [*Errors] sorted by line, each naming the file,
// the line and the key path:
//
//	host.toml:14: session[0].budget: must be a size: an integer (bytes) or a string such as "64MiB", not a boolean
//	host.toml:21: session[1].stage: module "mlp_fence" is a fence module: stage must name a stage module
//
// The schema is documented key by key in docs/manifest.md.
//
// The TOML is decoded into generic values by BurntSushi/toml and then
// walked against the schema here, rather than decoded into structs: struct
// decoding stops at the first type error and matches keys without regard
// to case, and the parser keeps key positions private and keyed without
// array indices. A small line index over the raw text (see lineindex.go)
// gives every key path, such as session[1].buffer[0].size, its line.
package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/internal/fileread"
	"github.com/stagehost/stagehost/stages"
)

// Version is the manifest schema version this package reads.
const Version = 1

// Manifest is a decoded and validated host.toml, with every default
// applied. Each field mirrors the key of the same name (Go spelling of the
// TOML snake_case key); sizes are bytes, durations are [time.Duration].
type Manifest struct {
	Path string // the manifest's name as given to Load or Decode
	Dir  string // the directory relative paths are resolved against

	Version   int
	Runtime   Runtime
	Service   Service
	Lattice   *Lattice // the [lattice] table; nil without one
	Tracing   *Tracing // the [tracing] table; nil without one
	Devices   []Device
	Modules   []Module
	Weights   []Weights
	Kernels   []Kernel // the [[kernel]] tables: vendor device programs
	Sessions  []Session
	Residents []Resident
	Tenants   []Tenant // the [[tenant]] tables
}

// Runtime is the [runtime] table.
type Runtime struct {
	Capacity    int // default 64
	TraceBuffer int // default 4096
	// CacheDir is where compiled modules are cached: "" for the default
	// user cache directory, "off" for no file cache, otherwise a directory
	// (relative ones resolved against the manifest's directory).
	CacheDir string
	// MaxModuleSize is the largest module file, in bytes, of a module
	// without its own max_size; default [stages.DefaultMaxModuleSize]
	// (64 MiB). It is the engine's limit too
	// ([stages.EngineConfig.WithMaxModuleSize]).
	MaxModuleSize int64
}

// Service is the [service] table: how `stagehost serve` serves. Durations
// of 0 mean no timeout; limits of 0 mean no limit. File paths are
// resolved against the manifest's directory; the tokens themselves are
// never in the manifest, only where to read them.
type Service struct {
	ReadHeaderTimeout time.Duration // default 10s
	ReadTimeout       time.Duration // default 30s: the whole request, body included
	WriteTimeout      time.Duration // default 60s
	IdleTimeout       time.Duration // default 120s
	MaxConnections    int           // default 1024
	MaxInFlight       int           // default 256
	DrainDelay        time.Duration // default 0
	// ReadyQuarantinedShare is the largest share (0..1) of a session's
	// instances that may be quarantined or failed while the service is
	// ready; default 0.
	ReadyQuarantinedShare float64
	AdminTokenFile        string // file of admin-scope bearer tokens, one a line; "" for none
	AdminTokenEnv         string // environment variable holding admin-scope tokens; "" for none
	InvokeTokenFile       string
	InvokeTokenEnv        string
	TLSCert, TLSKey       string // PEM certificate (chain) and key; both or neither
}

// DefaultService returns the [service] table's defaults.
func DefaultService() Service {
	return Service{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second,
		IdleTimeout: 120 * time.Second, MaxConnections: 1024, MaxInFlight: 256}
}

// Lattice is the [lattice] table: how `stagehost serve` joins a lattice
// of hosts over NATS (docs/lattice.md). Paths are resolved against the
// manifest's directory; the credentials themselves are never in the
// manifest, only where to read them.
type Lattice struct {
	Name   string // required: letters, digits, '-' or '_'
	HostID string // "" for the default: the hostname and the process id (or serve's --host-id)
	// URL is the NATS server's URL, or a comma-separated list of them;
	// "" when Embedded.
	URL string
	// Embedded starts a NATS server (JetStream on) inside the process,
	// listening on Listen (default 127.0.0.1:4222) with its store in
	// StoreDir ("" for the default: a directory under the user cache
	// directory).
	Embedded         bool
	Listen, StoreDir string
	// TokenFile (its first line) or TokenEnv holds a NATS auth token;
	// NkeySeedFile an nkey seed. At most one of them. An embedded server
	// requires the same credentials of its clients.
	TokenFile, TokenEnv, NkeySeedFile string
	// TLSCA verifies the server; TLSCert and TLSKey (both or neither) are
	// the client's certificate, and an embedded server's.
	TLSCA, TLSCert, TLSKey string
	// HeartbeatTTL is how long a host's heartbeat lasts; a host beats
	// every HeartbeatTTL/3. Default [DefaultHeartbeatTTL], 100ms to 1h.
	HeartbeatTTL time.Duration
	// ClaimTTL is how long a placement claim (a session with placement
	// "exclusive") lasts without a renewal; default [DefaultClaimTTL], at
	// least twice HeartbeatTTL.
	ClaimTTL time.Duration
	// FenceFailures is how many quarantined instances of a module's
	// sessions on one host put the module in the lattice's shared
	// quarantine; default [DefaultFenceFailures], 0 never.
	FenceFailures int
	// QuarantineOnDeviceLost puts a module in the shared quarantine when a
	// call to it made a device lost; default true.
	QuarantineOnDeviceLost bool
	// Replicas is how many NATS servers keep each of the lattice's KV
	// buckets (1 to 5); default 1.
	Replicas int
	// PayloadStoreMax bounds the bytes the lattice's payload store
	// holds (inputs and outputs too large for one message; 64KiB to
	// 1TiB); default [DefaultPayloadStoreMax].
	PayloadStoreMax int64
	// ClusterListen makes the embedded server a node of a NATS cluster:
	// the host:port its routes listen on ("" for none: a single server).
	// ClusterRoutes is the comma-separated nats-route://host:port URLs of
	// the cluster's nodes. Only with Embedded.
	ClusterListen, ClusterRoutes string
}

// DefaultLatticeListen is the [lattice] listen default of an embedded
// server: loopback only.
const DefaultLatticeListen = "127.0.0.1:4222"

// Defaults of the [lattice] table's timers and quarantine, the values a
// [Lattice] decoded without those keys holds. Code that builds a Lattice
// or a lattice host without a manifest uses them too, so that every
// process of a lattice agrees on them.
const (
	// DefaultHeartbeatTTL is the default heartbeat_ttl: a host that has
	// not beaten for 3s is gone (it beats every 1s).
	DefaultHeartbeatTTL = 3 * time.Second
	// DefaultClaimTTL is the default claim_ttl: an exclusive session's
	// placement claim not renewed for 10s lapses.
	DefaultClaimTTL = 10 * time.Second
	// DefaultFenceFailures is the default fence_failures: 3 quarantined
	// instances of a module's sessions on one host put the module in the
	// lattice's shared quarantine.
	DefaultFenceFailures = 3
	// DefaultPayloadStoreMax is the default payload_store_max: 1GiB.
	DefaultPayloadStoreMax = 1 << 30
)

// CacheOff is the cache_dir value that disables the file cache.
const CacheOff = "off"

// Backend names a device backend.
type Backend string

// The backends.
const (
	BackendSim  Backend = "sim"
	BackendCUDA Backend = "cuda"
)

// Device is one [[device]].
type Device struct {
	Name    string
	Backend Backend
	Engine  hw.Engine
	Index   int   // CUDA ordinal; 0 on sim devices
	Memory  int64 // bytes the sessions on the device may budget in total; 0 means unlimited
	// MaxParked bounds the resident GPU participants parked on a gpu
	// device at once, quarantined ones included; default 32; 0 on
	// devices of other engines.
	MaxParked int
	Sim       *Sim // non-nil exactly on sim devices
}

// Sim is a sim device's [device.sim] table.
type Sim struct {
	Latency    time.Duration // default 0
	QueueDepth int           // default 1024
	Faults     []Fault
}

// FaultKind names a fault injected into a sim device at start-up.
type FaultKind string

// The fault kinds. Each maps to the sim fault of the same meaning.
const (
	FaultReject         FaultKind = "reject"          // submissions fail at submit (Count of them)
	FaultFailCompletion FaultKind = "fail_completion" // commands retire with a fault (Count of them)
	FaultHang           FaultKind = "hang"            // stream workers stop until released
	FaultFailVisibility FaultKind = "fail_visibility" // visibility actions fail (Count of them); always device-wide
	FaultLose           FaultKind = "lose"            // the device is lost; always device-wide
)

// Counted reports whether Count applies to the kind.
func (k FaultKind) Counted() bool {
	return k == FaultReject || k == FaultFailCompletion || k == FaultFailVisibility
}

// DeviceWide reports whether the kind always affects the whole device, so
// that it cannot be limited to one session's streams.
func (k FaultKind) DeviceWide() bool { return k == FaultFailVisibility || k == FaultLose }

// Fault is one [[device.sim.fault]].
type Fault struct {
	Kind    FaultKind
	Count   int    // default 1
	Session string // "" for the whole device, else a session on the device
}

// Module is one [[module]], with its bytes read and checked.
type Module struct {
	Name        string
	Path        string // as written in the manifest
	File        string // Path resolved against the manifest's directory
	SHA256      string // lower-case hex sha256 of Bytes (equal to the declared one)
	Kind        stages.ModuleKind
	MemoryLimit int64    // bytes, default 64MiB
	MaxSize     int64    // the largest the file may be, in bytes; default Runtime.MaxModuleSize
	WASI        []string // grants, default none
	Snapshot    bool     // instances start from a snapshot taken at load (default true)
	Bytes       []byte   // the file's contents, read once (shared by modules naming the same file; do not modify)
	// Requires are the module's declared requirements (its
	// stagehost.requires section, abi/ABI.md §7); nil without one.
	Requires *abi.Requires
}

// LoadConfig returns the configuration to load the module with: its name,
// kind, memory limit, size limit, WASI grants and snapshot.
func (m *Module) LoadConfig() stages.LoadConfig {
	return stages.NewLoadConfig().WithName(m.Name).WithKind(m.Kind).
		WithMemoryLimit(m.MemoryLimit).WithMaxSize(m.MaxSize).WithWASI(m.WASI...).WithSnapshot(m.Snapshot)
}

// The fence values that name no module.
const (
	// FenceBuiltin: the stage module's own stagehost_fence if it exports
	// one, else the built-in drain of every stream.
	FenceBuiltin = "builtin"
	// FenceDrain: always the built-in drain of every stream.
	FenceDrain = "drain"
)

// Session is one [[session]] table: the declaration of a Wasm stage
// session (its module, device, resources and limits). It runs nothing;
// package deploy makes a [stages.Session] from it and serves it as a
// deploy.Pool.
type Session struct {
	Name         string
	Stage        string        // a stage module
	Fence        string        // FenceBuiltin (default), FenceDrain, or a fence module
	Device       string        // the first of Devices
	Devices      []string      // the devices its instances run on: manifest device (one) or devices (a list)
	Instances    int           // instances, spread over Devices in turn; default one per device
	QueueLimit   int           // calls that may wait for a free instance; past it, a call is refused (429); default 256
	QueueTimeout time.Duration // how long a call may wait for a free instance; default 10s
	Streams      []string      // default ["s0"]
	Programs     []string      // default none
	Budget       int64         // default 64MiB
	OutputLimit  int64         // default 16MiB
	Deadline     time.Duration // default 5s
	FenceTimeout time.Duration // default 10s
	InitTimeout  time.Duration // default 5s: bounds making each instance (start function, _initialize, stagehost_init)
	Reset        string        // ResetNone (default) or ResetCall
	Placement    string        // PlacementAny (default) or PlacementExclusive: how many hosts of a lattice serve it at once
	Entry        string        // default "main"
	OutputFormat string        // how the CLI prints the output: one of OutputFormats, default OutputHex
	Input        string        // resolved path of the default input file; "" for none
	MaxInput     int64         // the largest request body stagehost serve accepts for it; default MaxInputSize (64MiB)
	Buffers      []Buffer
	Weights      []string // the [[weights]] its instances may look up (weights_get, tensor_get); default none
	Tenant       string   // the [[tenant]] it belongs to; "" for none (see TenantName)
}

// WeightNames returns the names of the weights the session lists (its
// weights key): what a module's declared weights requirement is checked
// against. nil when it lists none: a module that declares weights is then
// refused with "session … lists no weights".
func (s *Session) WeightNames() []string {
	if len(s.Weights) == 0 {
		return nil
	}
	return s.Weights
}

// Offer returns what the session gives a module mod loads with: its
// programs, streams, weights and budget, and mod's WASI grants, for
// [abi.Requires.Check].
func (s *Session) Offer(wasi []string) abi.Offer {
	return abi.Offer{Session: s.Name, Programs: s.Programs, Streams: s.Streams, Weights: s.WeightNames(), Budget: s.Budget, WASI: wasi}
}

// Reset modes: what a session's instances keep between calls.
const (
	ResetNone = "none" // an instance keeps its memory from call to call (default)
	ResetCall = "call" // every call starts from the module's snapshot (stages.SessionConfig.WithResetPerCall)
)

// ResetModes lists the reset modes.
var ResetModes = []string{ResetNone, ResetCall}

// Placements: how many hosts of a lattice serve a session at once
// (docs/lattice.md, "Exclusive sessions"). Without a lattice a session is
// served by its one process either way.
const (
	PlacementAny       = "any"       // every host that has the session serves it (default)
	PlacementExclusive = "exclusive" // one host at a time: the holder of its placement claim; the others stand by
)

// Placements lists the placements.
var Placements = []string{PlacementAny, PlacementExclusive}

// Output formats: how `stagehost run` prints a session's output.
const (
	OutputHex   = "hex"   // hexadecimal (default)
	OutputText  = "text"  // a quoted UTF-8 string
	OutputF32   = "f32"   // little-endian float32 values
	OutputClass = "class" // a little-endian uint32 class, then float32 scores
)

// OutputFormats lists the output formats.
var OutputFormats = []string{OutputHex, OutputText, OutputF32, OutputClass}

// Buffer is one [[session.buffer]].
type Buffer struct {
	Name string
	Size int64
}

// StartupLineSize is the size of a resident session's startup line: one
// 64-byte, host-written line in coherent memory.
const StartupLineSize = 64

// Resident is one [[resident]]: a resident GPU–NPU session.
type Resident struct {
	Name            string
	GPU             string // a device with engine gpu
	NPU             string // a device with engine npu, or cpu as a stand-in
	Rounds          int    // default 16
	Payload         int64  // default 64
	StartupDeadline time.Duration
	JoinDeadline    time.Duration
	Budget          int64 // default 1MiB
	MaxRuns         int   // runs that may run at once; default 4
	History         int   // finished and running runs kept for listings; default 100
	MaxQuarantined  int   // quarantined runs kept before starts are refused; default 4
}

// Session returns the session named name, or nil.
func (m *Manifest) Session(name string) *Session {
	for i := range m.Sessions {
		if m.Sessions[i].Name == name {
			return &m.Sessions[i]
		}
	}
	return nil
}

// Module returns the module named name, or nil.
func (m *Manifest) Module(name string) *Module {
	for i := range m.Modules {
		if m.Modules[i].Name == name {
			return &m.Modules[i]
		}
	}
	return nil
}

// Device returns the device named name, or nil.
func (m *Manifest) Device(name string) *Device {
	for i := range m.Devices {
		if m.Devices[i].Name == name {
			return &m.Devices[i]
		}
	}
	return nil
}

// Resident returns the resident session named name, or nil.
func (m *Manifest) Resident(name string) *Resident {
	for i := range m.Residents {
		if m.Residents[i].Name == name {
			return &m.Residents[i]
		}
	}
	return nil
}

// Load reads the manifest at path and the files it names, and validates
// all of it. It is [Decode] with the file's contents and [ReadFile];
// errors name the file as path was given. The manifest must be a regular
// file of at most [MaxManifestSize] bytes.
//
//	m, err := manifest.Load("host.toml")
//	if err != nil {
//		log.Fatal(err) // one line per problem: host.toml:12: session[0].stage: ...
//	}
//	for _, s := range m.Sessions { ... }
//
// # Errors
//
// An [*Errors] listing every problem, or, only when the manifest itself
// cannot be read, an [*Errors] holding that one (class [errdefs.ErrNotFound]
// when it does not exist).
func Load(path string) (*Manifest, error) {
	return LoadWith(path, NewLoadConfig())
}

// LoadConfig configures [LoadWith]; it is immutable, each WithX returns
// a copy. Start from [NewLoadConfig].
type LoadConfig struct {
	weightsAtUpload bool
}

// NewLoadConfig returns the configuration of [Load]: every file the
// manifest names is checked against its sha256.
func NewLoadConfig() LoadConfig { return LoadConfig{} }

// WithWeightsHashAtUpload, when on, leaves the sha256 of each [[weights]]
// file to the deployment's upload, which hashes the bytes it streams to
// the device and refuses them when they do not match: the load reads
// only the file's size and its safetensors header, so that opening a
// deployment reads and hashes a weights file once, not twice (once here
// and once at the upload). A sha256 that is missing, empty or not 64 hex
// digits is still reported with the file's actual sha256. Use it where a
// deployment opens the manifest at once (run, serve); leave it off to
// check a manifest (stagehost check), where nothing is uploaded.
// [Weights.HashedAtLoad] tells which was done. Default off.
func (c LoadConfig) WithWeightsHashAtUpload(on bool) LoadConfig {
	c.weightsAtUpload = on
	return c
}

// LoadWith is [Load] configured by cfg.
//
// # Errors
//
// As [Load]'s.
func LoadWith(path string, cfg LoadConfig) (*Manifest, error) {
	data, err := ReadFile(path, MaxManifestSize)
	if err != nil {
		limit := fileLimit{MaxManifestSize, "the manifest size limit", ""}
		return nil, &Errors{List: []*Error{readError(path, 0, "", path, limit, err)}}
	}
	return decode(path, data, ReadFile, cfg)
}

// Decode decodes and validates a manifest held in memory. name is the
// manifest's path: errors are reported against it and the paths in the
// manifest are resolved against its directory, then read with readFile
// (nil means [ReadFile]), each with its limit: a module's max_size, or
// [MaxInputSize] for an input file. Tests and fuzzers pass a readFile
// that serves files from memory.
//
//	m, err := manifest.Decode("deploy/host.toml", data, manifest.ReadFile)
//	// module paths like "stage/mlp.wasm" are read as "deploy/stage/mlp.wasm"
//
// Decode never panics, whatever data holds.
//
// # Errors
//
// An [*Errors] listing every problem found, sorted by line, each an
// [*Error] naming name, the line and the key path:
//
//   - TOML syntax errors (only the first one: parsing stops there);
//   - unknown keys, each at its own line;
//   - values of the wrong type, out of range, or not one of the allowed
//     values; sizes and durations that do not parse;
//   - missing required keys, reported at their table's line;
//   - duplicate names, and names that resolve to nothing or to the wrong
//     kind of thing (a fence module as a stage, an npu device as gpu);
//   - budgets that do not fit: a session's buffers, a resident's startup
//     line and payload, the budgets on a device with a memory limit;
//   - files that cannot be read, that are not regular files, or that are
//     larger than their limit; a module whose sha256 differs from the
//     declared one (both are shown), and a module that fails
//     [stages.Validate] (reported at its path key).
//
// The manifest is returned only when there are no errors.
func Decode(name string, data []byte, readFile ReadFunc) (*Manifest, error) {
	return decode(name, data, readFile, NewLoadConfig())
}

func decode(name string, data []byte, readFile ReadFunc, cfg LoadConfig) (*Manifest, error) {
	if readFile == nil {
		readFile = ReadFile
	}
	d := &decoder{
		file:            name,
		dir:             filepath.Dir(name),
		readFile:        readFile,
		idx:             indexLines(data),
		weightsAtUpload: cfg.weightsAtUpload,
	}
	m := d.decode(data)
	if len(d.errs) > 0 {
		return nil, &Errors{List: sortErrors(d.errs)}
	}
	return m, nil
}

// resolve returns p relative to dir (p itself when absolute).
func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// readError is the error for a file that could not be read within its
// limit.
func readError(file string, line int, key, path string, limit fileLimit, err error) *Error {
	class := errdefs.ErrInvalidArgument
	msg := fmt.Sprintf("cannot read %q: %s", path, escapeUnprintable(unwrapPathError(err).Error()))
	var nr *fileread.NotRegularError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		class = errdefs.ErrNotFound
		msg = fmt.Sprintf("file %q does not exist", path)
	case errors.As(err, &nr):
		msg = fmt.Sprintf("%q is not a regular file: it is %s", path, nr.Kind)
	case errors.Is(err, ErrTooLarge):
		msg = fmt.Sprintf("file %q is larger than %s of %s%s", path, limit.what, FormatSize(limit.size), limit.note)
	}
	return &Error{File: file, Line: line, Key: key, Msg: msg, class: class}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
