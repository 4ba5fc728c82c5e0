package hw_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stagehost/stagehost/hw"
)

func TestErrorsBelongToOneClassAndKeepTheirCause(t *testing.T) {
	cause := errors.New("root cause")
	err := hw.Errorf(hw.ErrDeviceLost, "fence failed: %w (while %v)", cause, hw.ErrBusy)
	if !errors.Is(err, hw.ErrDeviceLost) || !errors.Is(err, cause) {
		t.Fatal("class or cause lost")
	}
	if hw.ClassOf(err) != hw.ErrDeviceLost || hw.ClassOf(fmt.Errorf("ctx: %w", err)) != hw.ErrDeviceLost {
		t.Fatal("ClassOf must report the primary class")
	}
	if err.Error() != "fence failed: root cause (while busy)" {
		t.Fatalf("message %q", err)
	}
	if hw.ClassOf(errors.New("plain")) != nil {
		t.Fatal("a plain error has no class")
	}
	for _, c := range hw.Classes {
		if hw.ClassOf(hw.Errorf(c, "x")) != c {
			t.Fatalf("class %v", c)
		}
	}
}

func TestContextErrorMatchesBothClassAndCause(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	err := hw.ContextError(ctx, "waiting")
	if !errors.Is(err, hw.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := hw.ContextError(ctx2, "waiting"); !errors.Is(err, context.Canceled) || !errors.Is(err, hw.ErrDeadlineExceeded) {
		t.Fatalf("%v", err)
	}
}

func TestErrorsIsAllocatesNothing(t *testing.T) {
	err := hw.Errorf(hw.ErrBusy, "queue full")
	if n := testing.AllocsPerRun(100, func() {
		if errors.Is(err, hw.ErrDeviceLost) {
			t.Fatal("wrong class")
		}
	}); n != 0 {
		t.Fatalf("errors.Is allocates %v", n)
	}
}

func TestBudgetChargesAndReleases(t *testing.T) {
	b := hw.NewBudget("b", 100)
	if err := b.Charge(60); err != nil {
		t.Fatal(err)
	}
	if err := b.Charge(41); !errors.Is(err, hw.ErrOutOfBudget) || b.Used() != 60 {
		t.Fatalf("%v, used %d", err, b.Used())
	}
	if err := b.Charge(-1); !errors.Is(err, hw.ErrInvalidArgument) {
		t.Fatal(err)
	}
	b.Release(60)
	if b.Used() != 0 {
		t.Fatal(b.Used())
	}
	var unlimited *hw.Budget
	if unlimited.Charge(1<<40) != nil || unlimited.Used() != 0 {
		t.Fatal("nil budget")
	}
}
