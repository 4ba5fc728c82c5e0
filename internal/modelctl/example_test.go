package modelctl_test

import (
	"context"
	"fmt"
	"os"

	"github.com/stagehost/stagehost/internal/modelctl"
)

func ExampleOpenDir() {
	dir, err := os.MkdirTemp("", "state-*")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	st := modelctl.OpenDir(dir)
	ctx := context.Background()
	// The supervisor records a swap; a worker that starts reads it back
	// (modelctl.Restore applies it to its deployment).
	_ = st.Update(ctx, func(s *modelctl.State) error {
		s.SetSwap(modelctl.SwapRecord{Session: "classify", Stage: "v2@ab12", ManifestStage: "v1@cd34"})
		return nil
	})
	s, err := st.Load(ctx)
	fmt.Println(s.Version, s.Swaps[0].Session, s.Swaps[0].Stage, err)
	// Output:
	// 1 classify v2@ab12 <nil>
}
