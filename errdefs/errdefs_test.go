package errdefs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

func TestErrorsBelongToOneClassAndKeepTheirCause(t *testing.T) {
	cause := errors.New("root cause")
	err := errdefs.Errorf(errdefs.ErrDeviceLost, "fence failed: %w (while %v)", cause, errdefs.ErrBusy)
	if !errors.Is(err, errdefs.ErrDeviceLost) || !errors.Is(err, cause) {
		t.Fatal("class or cause lost")
	}
	if errdefs.ClassOf(err) != errdefs.ErrDeviceLost || errdefs.ClassOf(fmt.Errorf("ctx: %w", err)) != errdefs.ErrDeviceLost {
		t.Fatal("ClassOf must report the primary class")
	}
	if err.Error() != "fence failed: root cause (while busy)" {
		t.Fatalf("message %q", err)
	}
	if errdefs.ClassOf(errors.New("plain")) != nil {
		t.Fatal("a plain error has no class")
	}
	for _, c := range errdefs.Classes {
		if errdefs.ClassOf(errdefs.Errorf(c, "x")) != c {
			t.Fatalf("class %v", c)
		}
	}
}

func TestContextErrorMatchesBothClassAndCause(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	err := errdefs.ContextError(ctx, "waiting")
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := errdefs.ContextError(ctx2, "waiting"); !errors.Is(err, context.Canceled) || !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("%v", err)
	}
}

func TestErrorsIsAllocatesNothing(t *testing.T) {
	err := errdefs.Errorf(errdefs.ErrBusy, "queue full")
	if n := testing.AllocsPerRun(100, func() {
		if errors.Is(err, errdefs.ErrDeviceLost) {
			t.Fatal("wrong class")
		}
	}); n != 0 {
		t.Fatalf("errors.Is allocates %v", n)
	}
}
