//go:build wasip1

package fence

import (
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/internal/host"
)

//go:wasmexport stagehost_fence
func abiFence() int32 { return run() }

// run is the stagehost_fence export's body. It returns StatusOf the
// fence's error: FAULT tells the host the work drained but device work
// failed; any other non-zero status is a failed fence (see the package
// doc).
func run() int32 {
	fn := host.Fence()
	if fn == nil {
		stagehost.Log(stagehost.LevelError, "fence: the module exports stagehost_fence but registered no fence")
		return int32(stagehost.StatusUnsupported)
	}
	if err := fn(); err != nil {
		stagehost.Log(stagehost.LevelError, "fence: "+err.Error())
		return int32(stagehost.StatusOf(err))
	}
	return 0
}
