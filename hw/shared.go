package hw

// Shared is a host-coherent allocation that a chosen set of devices can
// access, used for startup words and shared payloads.
//
// The host writes a control word with [Shared.Store32Release], then runs
// the prepared [VisibilityAction] of each device so that device observes
// the store (a flush, a doorbell, or nothing on fully coherent links).
// Devices read control words with acquire loads.
type Shared interface {
	// Size in bytes.
	Size() int
	// Bytes is the host mapping.
	Bytes() []byte
	// Devices that can access the allocation.
	Devices() []Device
	// Store32Release atomically stores v at byte offset off (a multiple
	// of 4) with release ordering.
	Store32Release(off int, v uint32)
	// Load32Acquire atomically loads the word at byte offset off with
	// acquire ordering.
	Load32Acquire(off int) uint32
	// PrepareRelease prepares the action that makes host stores in
	// [off, off+length) visible to dev. Preparing may allocate; executing
	// must not.
	PrepareRelease(dev Device, off, length int) (VisibilityAction, error)
	// View returns the allocation as a [Buffer] of dev, so it can be passed
	// as a program argument on dev's streams. Freeing a view is a no-op;
	// the allocation lives until [Shared.Free].
	View(dev Device) (Buffer, error)
	// Free releases the memory and its budget charge.
	Free() error
}

// VisibilityAction makes earlier host stores visible to one device.
type VisibilityAction interface {
	Execute() error
}
