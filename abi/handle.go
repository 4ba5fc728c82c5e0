package abi

// Handle is a guest-visible resource name (ABI.md §2): kind in bits 63–56,
// the owning session's tag in bits 55–32, a never-reused serial in bits
// 31–0.
type Handle uint64

// HandleKind is the kind of resource a handle names.
type HandleKind uint8

// Handle kinds.
const (
	KindStream  HandleKind = 1
	KindBuffer  HandleKind = 2
	KindProgram HandleKind = 3
)

func (k HandleKind) String() string {
	switch k {
	case KindStream:
		return "stream"
	case KindBuffer:
		return "buffer"
	case KindProgram:
		return "program"
	}
	return "unknown"
}

// MaxTag is the largest session tag (24 bits).
const MaxTag = 1<<24 - 1

// MakeHandle builds a handle.
func MakeHandle(kind HandleKind, tag uint32, serial uint32) Handle {
	return Handle(uint64(kind)<<56 | uint64(tag&MaxTag)<<32 | uint64(serial))
}

// Kind is the handle's kind field.
func (h Handle) Kind() HandleKind { return HandleKind(h >> 56) }

// Tag is the handle's session tag.
func (h Handle) Tag() uint32 { return uint32(h>>32) & MaxTag }

// Serial is the handle's serial number.
func (h Handle) Serial() uint32 { return uint32(h) }
