package errdefs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

// TestRemoteErrorUnwrapsToClass: an error answered by another host
// matches its class with errors.Is, wrapped or not, and no other class.
func TestRemoteErrorUnwrapsToClass(t *testing.T) {
	for _, class := range errdefs.Classes {
		name := errdefs.Name(class)
		if name == "" || errdefs.ByName(name) != class {
			t.Fatalf("class %v: name %q does not map back", class, name)
		}
		err := fmt.Errorf("session s: %w", &errdefs.RemoteError{Class: name, Message: "refused", Host: "h2"})
		for _, other := range errdefs.Classes {
			if got := errors.Is(err, other); got != (other == class) {
				t.Errorf("remote %s: errors.Is(err, %v) = %v", name, other, got)
			}
		}
		if errdefs.ClassOf(err) != class || errdefs.Name(err) != name {
			t.Errorf("remote %s: ClassOf %v, Name %q", name, errdefs.ClassOf(err), errdefs.Name(err))
		}
	}
	busy := &errdefs.RemoteError{Class: errdefs.ClassBusy, Message: "busy"}
	if !errors.Is(busy, errdefs.ErrBusy) || errdefs.HTTPStatus(errdefs.Name(busy)) != 429 {
		t.Errorf("a remote busy error is not ErrBusy with status 429")
	}
	un := &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Message: "no host"}
	if errdefs.ClassOf(un) != nil || errdefs.Name(un) != errdefs.ClassUnavailable || errdefs.HTTPStatus(errdefs.Name(un)) != 503 {
		t.Errorf("a remote unavailable error: class %v, name %q", errdefs.ClassOf(un), errdefs.Name(un))
	}
	if errdefs.HTTPStatus("no such class") != 500 {
		t.Errorf("an unknown class is not 500")
	}
}
