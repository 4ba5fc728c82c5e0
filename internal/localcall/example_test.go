package localcall_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/localcall"
)

// ExampleServe: a worker serves its calls on a socket, and the
// supervisor's client calls it.
func ExampleServe() {
	dir, _ := os.MkdirTemp("", "lc")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "worker.sock")
	ln, err := localcall.Listen(path) // mode 0600
	if err != nil {
		fmt.Println(err)
		return
	}
	stop := localcall.Serve(ln, func(ctx context.Context, c localcall.Call) ([]byte, error) {
		if c.Session != "echo" {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", c.Session)
		}
		return c.Input, nil
	}, 1<<20)
	defer stop()

	c := localcall.NewClient(path, localcall.NewClientConfig())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.Call(ctx, "echo", "req-1", nil, []byte("hello"))
	fmt.Printf("%s %v\n", out, err)
	_, err = c.Call(ctx, "other", "req-2", nil, nil)
	fmt.Println(errors.Is(err, errdefs.ErrNotFound), err)
	// Output:
	// hello <nil>
	// true no session "other"
}

// ExampleClient_Call: a call to a socket nobody listens on was not
// sent, so it may go another way (the supervisor sends it through the
// lattice).
func ExampleClient_Call() {
	c := localcall.NewClient(filepath.Join(os.TempDir(), "no-such-worker.sock"), localcall.NewClientConfig().WithMaxAnswer(1<<20))
	defer c.Close()
	_, err := c.Call(context.Background(), "echo", "", nil, []byte("hello"))
	fmt.Println(errors.Is(err, localcall.ErrNotSent))
	// Output:
	// true
}
