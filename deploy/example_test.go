package deploy_test

import (
	"context"
	"fmt"
	"time"

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

func ExampleConfig_WithOverdue() {
	m, err := manifest.Load("../host.toml")
	if err != nil {
		panic(err)
	}
	// A call still running 100 ms past its deadline is reported: its
	// stage was interrupted at the deadline, so its fence is waiting on
	// device work that has not finished. A tenant's worker of `serve
	// --supervise` asks its supervisor to kill it then.
	overdue := make(chan deploy.Overdue, 1)
	cfg := deploy.NewConfig().WithOnly("fill").WithOverdue(100*time.Millisecond, func(o deploy.Overdue) {
		select {
		case overdue <- o:
		default:
		}
	})
	d, err := deploy.Open(context.Background(), m, cfg)
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	_, err = d.Pool("fill").Run(context.Background(), nil)
	fmt.Println(err, len(overdue)) // this call ended in time: nothing reported
	// Output:
	// <nil> 0
}
