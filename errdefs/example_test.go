package errdefs_test

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/stagehost/stagehost/errdefs"
)

func ExampleErrorf() {
	err := errdefs.Errorf(errdefs.ErrInvalidArgument, "buffer range [%d,%d) exceeds size %d: %w", 8, 24, 16, io.ErrShortBuffer)
	fmt.Println(err)
	fmt.Println(errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, io.ErrShortBuffer))
	// Output:
	// buffer range [8,24) exceeds size 16: short buffer
	// true true
}

func ExampleClassOf() {
	// The class given to Errorf wins over a wrapped cause of another class.
	cause := errdefs.Errorf(errdefs.ErrDeviceLost, "gpu0 lost")
	err := errdefs.Errorf(errdefs.ErrFault, "launch failed: %w", cause)
	fmt.Println(errdefs.ClassOf(err) == errdefs.ErrFault, errors.Is(err, errdefs.ErrDeviceLost))
	fmt.Println(errdefs.ClassOf(errors.New("unclassified")))
	// Output:
	// true true
	// <nil>
}

func ExampleContextError() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := errdefs.ContextError(ctx, "waiting for the stream")
	fmt.Println(err)
	fmt.Println(errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.Canceled))
	// Output:
	// waiting for the stream: context canceled
	// true true
}
