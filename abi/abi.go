// Package abi is stagehost's guest ABI v1 as code: the import module name,
// every host function's name and signature, the exports a module provides,
// status codes, handle layout and argument records. ABI.md in this
// directory is the normative specification; this package must agree with
// it.
package abi

import "github.com/tetratelabs/wazero/api"

// Version is the ABI version this package describes.
const Version = 1

// Revision is the revision of v1 this package describes (ABI.md §1.4).
// Revision 1 is the first release of v1; each later revision only adds
// host functions, listed in [AddedIn].
const Revision = 4

// AddedIn gives the revision of v1 that added each host function added
// after the first release. A module that imports one is refused at load
// by a host of an earlier revision (which does not know the import);
// every other function is of revision 1.
var AddedIn = map[string]int{
	FnLastError:    2,
	FnWeightsGet:   3,
	FnTensorGet:    3,
	FnStreamLaunch: 4,
}

const (
	// ImportModule is the module name guests import host functions from.
	ImportModule = "stagehost_v1"
	// MarkerPrefix starts every version-marker export name.
	MarkerPrefix = "stagehost_abi_v"
	// Marker is the v1 version-marker export, of type () -> ().
	Marker = "stagehost_abi_v1"
	// WASIModule is the WASI preview 1 import module.
	WASIModule = "wasi_snapshot_preview1"
)

// Export names.
const (
	ExportMemory     = "memory"
	ExportRun        = "stagehost_run"   // () -> i32, stage entry
	ExportFence      = "stagehost_fence" // () -> i32, optional fence
	ExportInit       = "stagehost_init"  // () -> i32, optional init
	ExportInitialize = "_initialize"     // () -> (), WASI reactor init
	// ExportNoSnapshot, of type () -> (), is never called: a module that
	// exports it is initialised per instance rather than from a snapshot
	// taken at load (ABI.md §4.3).
	ExportNoSnapshot = "stagehost_no_snapshot"
	// ExportStart is a WASI command's entry point. A module that imports
	// WASI and exports it is refused (ABI.md §1.3).
	ExportStart = "_start"
)

// Host function names, in module [ImportModule].
const (
	FnInputSize         = "input_size"
	FnInputRead         = "input_read"
	FnOutputWrite       = "output_write"
	FnEntryName         = "entry_name"
	FnErrorSet          = "error_set"
	FnLastError         = "last_error" // revision 2
	FnLog               = "log"
	FnStreamGet         = "stream_get"
	FnBufferGet         = "buffer_get"
	FnProgramGet        = "program_get"
	FnBufferAlloc       = "buffer_alloc"
	FnBufferAllocNamed  = "buffer_alloc_named"
	FnBufferFree        = "buffer_free"
	FnBufferSize        = "buffer_size"
	FnStreamWrite       = "stream_write"
	FnStreamRead        = "stream_read"
	FnStreamSubmit      = "stream_submit"
	FnStreamSubmitBatch = "stream_submit_batch"
	FnStreamSync        = "stream_sync"
	FnStreamIdle        = "stream_idle"
	FnWeightsGet        = "weights_get"   // revision 3
	FnTensorGet         = "tensor_get"    // revision 3
	FnStreamLaunch      = "stream_launch" // revision 4
)

// Signature is a host function's Wasm type.
type Signature struct {
	Params  []api.ValueType
	Results []api.ValueType
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// Functions lists every host function of v1 with its signature. Every
// function returns one i32 status.
var Functions = map[string]Signature{
	FnInputSize:         {[]api.ValueType{i32}, []api.ValueType{i32}},
	FnInputRead:         {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	FnOutputWrite:       {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	FnEntryName:         {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnErrorSet:          {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	FnLastError:         {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnLog:               {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnStreamGet:         {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnBufferGet:         {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnProgramGet:        {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnBufferAlloc:       {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	FnBufferAllocNamed:  {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	FnBufferFree:        {[]api.ValueType{i64}, []api.ValueType{i32}},
	FnBufferSize:        {[]api.ValueType{i64, i32}, []api.ValueType{i32}},
	FnStreamWrite:       {[]api.ValueType{i64, i64, i32, i32, i32}, []api.ValueType{i32}},
	FnStreamRead:        {[]api.ValueType{i64, i64, i32, i32, i32}, []api.ValueType{i32}},
	FnStreamSubmit:      {[]api.ValueType{i64, i64, i32, i32}, []api.ValueType{i32}},
	FnStreamSubmitBatch: {[]api.ValueType{i64, i32, i32}, []api.ValueType{i32}},
	FnStreamSync:        {[]api.ValueType{i64}, []api.ValueType{i32}},
	FnStreamIdle:        {[]api.ValueType{i64, i32}, []api.ValueType{i32}},
	FnWeightsGet:        {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnTensorGet:         {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	FnStreamLaunch:      {[]api.ValueType{i64, i64, i32, i32, i32, i32, i32}, []api.ValueType{i32}},
}

// ExportSignatures gives the required type of each function export the
// host calls.
var ExportSignatures = map[string]Signature{
	Marker:           {},
	ExportRun:        {nil, []api.ValueType{i32}},
	ExportFence:      {nil, []api.ValueType{i32}},
	ExportInit:       {nil, []api.ValueType{i32}},
	ExportInitialize: {},
	ExportNoSnapshot: {},
}

// Limits of v1.
const (
	MaxArgs          = 16   // argument records per launch
	MaxBatch         = 1024 // launches per batch
	ArgRecordSize    = 24
	BatchRecordSize  = 16
	MaxErrorMessage  = 4096
	MaxBufferName    = 256 // bytes in a buffer_alloc_named name
	DefaultEntryName = "main"
	ToEnd            = 0xFFFFFFFF // argument length meaning "to the end of the buffer"
	// TensorRecordSize is the size of tensor_get's record: handle u64,
	// offset u64, nbytes u64, dtype u32, rank u32, dims [MaxTensorRank]u64.
	TensorRecordSize = 96
	// MaxTensorRank is the most dimensions a tensor_get record holds.
	MaxTensorRank = 8
)

// Argument kinds in an argument record.
const (
	ArgScalar uint32 = 0
	ArgBuffer uint32 = 1
)

// Log levels.
const (
	LogDebug int32 = iota
	LogInfo
	LogWarn
	LogError
)

// GoRuntimeWASI lists the WASI functions a Go (GOOS=wasip1) guest imports;
// the "go-runtime" grant names exactly these.
var GoRuntimeWASI = []string{
	"fd_write", "random_get", "clock_time_get", "args_sizes_get", "args_get",
	"environ_sizes_get", "environ_get", "proc_exit", "sched_yield",
	"fd_close", "fd_fdstat_get", "fd_fdstat_set_flags", "fd_prestat_get",
	"fd_prestat_dir_name", "poll_oneoff", "fd_read", "fd_seek",
}

// InternalModule is the reserved import namespace of the host's own
// instrumentation: the host adds an import from it to every module it
// loads, and refuses any module that imports from it itself.
const InternalModule = "stagehost_internal"

// FnYield is the function of [InternalModule] that an instrumented module
// calls when its interruption countdown runs out, of type () -> i32: the
// host checks the call's deadline and cancellation, unwinds the guest if
// either has passed, and otherwise returns the new countdown.
const FnYield = "yield"

// WASISignatures are the Wasm types of the WASI preview 1 functions in
// [GoRuntimeWASI]. A granted WASI function imported with another type is
// refused at load.
var WASISignatures = map[string]Signature{
	"fd_write":            {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	"random_get":          {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"clock_time_get":      {[]api.ValueType{i32, i64, i32}, []api.ValueType{i32}},
	"args_sizes_get":      {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"args_get":            {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"environ_sizes_get":   {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"environ_get":         {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"proc_exit":           {[]api.ValueType{i32}, nil},
	"sched_yield":         {nil, []api.ValueType{i32}},
	"fd_close":            {[]api.ValueType{i32}, []api.ValueType{i32}},
	"fd_fdstat_get":       {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"fd_fdstat_set_flags": {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"fd_prestat_get":      {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"fd_prestat_dir_name": {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	"poll_oneoff":         {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	"fd_read":             {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	"fd_seek":             {[]api.ValueType{i32, i64, i32, i32}, []api.ValueType{i32}},
}
