package service_test

import (
	"testing"

	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// TestSupervisedLatticeDefaults: serve --supervise without [lattice]
// uses the manifest's defaults, the payload store's byte limit included
// (a zero limit would be none).
func TestSupervisedLatticeDefaults(t *testing.T) {
	lt := service.SupervisedLattice("sup")
	if lt.Name != "sup" || lt.HeartbeatTTL != manifest.DefaultHeartbeatTTL || lt.ClaimTTL != manifest.DefaultClaimTTL ||
		lt.FenceFailures != manifest.DefaultFenceFailures || lt.QuarantineOnDeviceLost || lt.PayloadStoreMax != manifest.DefaultPayloadStoreMax {
		t.Fatalf("%+v", lt)
	}
}
