package safetensors

import "github.com/stagehost/stagehost/errdefs"

// errorf is every refusal of the reader: class [errdefs.ErrInvalidArgument].
// It is the one file that differs from the guest SDK's copy of this
// package (guest-sdk/internal/safetensors), whose errors are plain.
func errorf(format string, args ...any) error {
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "safetensors: "+format, args...)
}
