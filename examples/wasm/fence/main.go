// Command fence is a fence module: it provides only stagehost_fence, which
// the host calls after every stage of the sessions it is configured for.
// It drains stream "s0" and confirms that the stream is idle.
//
// A launch that failed is reported by the stream's Sync, but the stream is
// drained all the same: this fence logs the failure and succeeds, leaving
// it to the stage to report failures to its caller. (The host's built-in
// fence instead fails, and quarantines the session, on any such failure.)
// A fence that cannot drain, because "s0" is missing or the device is lost,
// fails.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o fence.wasm .
package main

import (
	"errors"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/fence"
)

func init() { fence.Register(drain) }

func main() {}

var errBusy = errors.New("fence: stream s0 still busy after sync")

func drain() error {
	s, err := stagehost.LookupStream("s0")
	if err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		if !errors.Is(err, stagehost.ErrFault) {
			return err
		}
		stagehost.Log(stagehost.LevelWarn, "fence: a command on s0 failed: "+err.Error())
	}
	idle, err := s.Idle()
	if err != nil {
		return err
	}
	if !idle {
		return errBusy
	}
	stagehost.Log(stagehost.LevelDebug, "fence: s0 drained")
	return nil
}
