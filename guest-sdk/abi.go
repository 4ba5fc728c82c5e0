package stagehost

import "strconv"

// ABI v1 constants (ABI.md). abi/sdk_consistency_test.go in the host
// module checks them against package abi.
const (
	// Version is the ABI version this SDK implements.
	Version = 1
	// Revision is the highest revision of v1 that any function of this
	// SDK needs (ABI.md §1.4). Every module built with it imports
	// last_error, of revision 2, so it is refused at load by a host of
	// revision 1; a module that calls LookupWeights or LookupTensor
	// imports weights_get or tensor_get, of revision 3, and needs a host
	// of revision 3 (the Go linker imports only the functions a module
	// calls); one that calls Stream.Launch imports stream_launch, of
	// revision 4.
	Revision = 4

	importModule = "stagehost_v1"     // the module every host import comes from
	abiMarker    = "stagehost_abi_v1" // the version-marker export
	runExport    = "stagehost_run"    // the stage entry export

	// MaxArgs is the most arguments one launch may carry.
	MaxArgs = 16
	// MaxBatch is the most launches one SubmitBatch may carry.
	MaxBatch = 1024
	// MaxErrorMessage is the longest error message the host keeps; the
	// SDK cuts longer ones at a UTF-8 boundary.
	MaxErrorMessage = 4096
	// DefaultEntry is the entry name the host requests unless told
	// otherwise, and the one Main registers.
	DefaultEntry = "main"
	// ToEnd as an argument length means "to the end of the buffer".
	ToEnd = 0xFFFFFFFF

	argRecordSize    = 24 // ABI.md §3.1
	batchRecordSize  = 16 // ABI.md §3.2
	tensorRecordSize = 96 // ABI.md §3, tensor_get
	maxTensorRank    = 8  // dims in a tensor_get record

	argScalar = 0 // argument record kinds
	argBuffer = 1

	kindStream  = 1 // handle kinds, bits 63–56 of a handle
	kindBuffer  = 2
	kindProgram = 3
)

// Level is a log level of the host's log function.
type Level int32

// Log levels (ABI.md §3, log).
const (
	LevelDebug Level = 0
	LevelInfo  Level = 1
	LevelWarn  Level = 2
	LevelError Level = 3
)

func (l Level) String() string {
	switch l {
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	case LevelWarn:
		return "warn"
	case LevelError:
		return "error"
	}
	return "level(" + strconv.Itoa(int(l)) + ")"
}
