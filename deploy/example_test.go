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
	d, err := deploy.Open(context.Background(), m, deploy.Options{})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	s := d.Session("fill")
	out, err := s.Run(context.Background(), nil)
	fmt.Println(len(out), err, s.Status().State)
	run, err := d.Resident("pingpong").Run(context.Background())
	fmt.Println(run.State, run.Rounds, err)
	// Output:
	// 4 <nil> ready
	// verified 64 <nil>
}
