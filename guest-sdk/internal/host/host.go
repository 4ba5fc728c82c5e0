// Package host is the seam between the guest SDK and an in-process host on
// platforms other than wasip1. On wasip1 the SDK calls the real host's
// imports instead and this package is unused.
//
// The emulator (package emu) implements [Host] and attaches itself for the
// duration of one stage run; the SDK's native bindings forward every ABI
// call to the attached host. Attachment is process-wide, like the one
// instance a Wasm host runs the guest in, so only one host is attached at
// a time: [Attach] waits for the previous one to detach.
package host

import "sync"

// Host is ABI v1 (ABI.md §3) with Go slices in place of guest pointers.
// Every method returns the i32 status of the host function; out-values are
// meaningful only when the status is 0.
//
// StreamSubmit receives count argument records of 24 bytes in args.
// StreamSubmitBatch receives count batch records of 16 bytes in cmds, whose
// args_ptr fields are byte offsets into args (the native stand-in for guest
// memory).
type Host interface {
	InputSize() (n uint32, status int32)
	InputRead(offset uint32, dst []byte) (n uint32, status int32)
	OutputWrite(src []byte) int32
	// EntryName copies the entry name into dst and returns its length; when
	// dst is too small it returns the length and OUT_OF_BOUNDS.
	EntryName(dst []byte) (n uint32, status int32)
	ErrorSet(msg []byte) int32
	// LastError copies the call's last error message (ABI.md §3
	// last_error) into dst and returns its length; when dst is too small
	// it returns the length and OUT_OF_BOUNDS.
	LastError(dst []byte) (n uint32, status int32)
	Log(level int32, msg []byte) int32
	StreamGet(name []byte) (handle uint64, status int32)
	BufferGet(name []byte) (handle uint64, status int32)
	ProgramGet(name []byte) (handle uint64, status int32)
	BufferAlloc(size uint32) (handle uint64, status int32)
	// BufferAllocNamed returns the live buffer allocated under name if it
	// has size bytes, or allocates and names one.
	BufferAllocNamed(name []byte, size uint32) (handle uint64, status int32)
	BufferFree(buffer uint64) int32
	BufferSize(buffer uint64) (size uint32, status int32)
	StreamWrite(stream, buffer uint64, offset uint32, src []byte) int32
	StreamRead(stream, buffer uint64, offset uint32, dst []byte) int32
	StreamSubmit(stream, program uint64, args []byte, count uint32) int32
	StreamSubmitBatch(stream uint64, cmds, args []byte, count uint32) int32
	// StreamLaunch is stream_launch: one launch of a vendor kernel with
	// its grid, block and shared memory (revision 4).
	StreamLaunch(stream, program uint64, grid, block [3]uint32, shared uint32, args []byte, count uint32) int32
	StreamSync(stream uint64) int32
	StreamIdle(stream uint64) (idle uint32, status int32)
	// WeightsGet is weights_get: the read-only handle of the weights
	// called name (revision 3).
	WeightsGet(name []byte) (handle uint64, status int32)
	// TensorGet is tensor_get: it writes the 96-byte record of the tensor
	// "<weights>/<tensor>" into rec (revision 3).
	TensorGet(name []byte, rec []byte) int32
}

var (
	attachMu sync.Mutex // held while a host is attached

	mu      sync.RWMutex
	current Host
	run     func(stage any) int32
	fence   func() error
)

// Attach makes h the host every SDK call goes to, waiting until no other
// host is attached, and returns the function that detaches it.
func Attach(h Host) (detach func()) {
	attachMu.Lock()
	mu.Lock()
	current = h
	mu.Unlock()
	return func() {
		mu.Lock()
		current = nil
		mu.Unlock()
		attachMu.Unlock()
	}
}

// Current is the attached host, or nil.
func Current() Host {
	mu.RLock()
	defer mu.RUnlock()
	return current
}

// SetRun installs the SDK's stage dispatcher: the function the stagehost_run
// export calls on wasip1. stage is nil (dispatch by entry name through the
// registry) or a func(*stagehost.Call) error to run instead.
func SetRun(f func(stage any) int32) {
	mu.Lock()
	run = f
	mu.Unlock()
}

// Run calls the dispatcher as the host calls stagehost_run. It returns
// false if the SDK's root package is not linked in.
func Run(stage any) (int32, bool) {
	mu.RLock()
	f := run
	mu.RUnlock()
	if f == nil {
		return 0, false
	}
	return f(stage), true
}

// SetFence records the fence registered with package fence (the module's
// own stagehost_fence export on wasip1).
func SetFence(f func() error) {
	mu.Lock()
	fence = f
	mu.Unlock()
}

// Fence returns the registered fence, or nil.
func Fence() func() error {
	mu.RLock()
	defer mu.RUnlock()
	return fence
}
