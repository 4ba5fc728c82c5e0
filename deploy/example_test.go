package deploy_test

import (
	"context"
	"fmt"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/manifest"
)

func ExampleOpen() {
	m, err := manifest.Load("../host.toml")
	if err != nil {
		panic(err)
	}
	// Only opens the one session (and loads only its module); without
	// it Open makes every session and resident session of the manifest.
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithOnly("fill"))
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	s := d.Pool("fill")
	out, err := s.Run(context.Background(), nil)
	fmt.Println(len(out), err, s.Status().State)
	// Output:
	// 4 <nil> ready
}

func ExampleDeployment_Resident() {
	m, err := manifest.Load("../host.toml")
	if err != nil {
		panic(err)
	}
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig().WithOnly("pingpong"))
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	run, err := d.Resident("pingpong").Run(context.Background())
	fmt.Println(run.State, run.Rounds, err)
	// Output:
	// verified 64 <nil>
}
