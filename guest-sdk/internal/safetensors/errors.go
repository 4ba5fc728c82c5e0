package safetensors

import (
	"errors"
	"fmt"
)

// errorf is every refusal of the reader: a plain error (the host's copy
// gives them the class invalid_argument). It is the one file of this
// package that is not copied from the host's internal/safetensors.
func errorf(format string, args ...any) error {
	return errors.New("safetensors: " + fmt.Sprintf(format, args...))
}
