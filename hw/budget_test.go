package hw_test

import (
	"errors"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

func TestBudgetChargesAndReleases(t *testing.T) {
	b := hw.NewBudget("b", 100)
	if err := b.Charge(60); err != nil {
		t.Fatal(err)
	}
	if err := b.Charge(41); !errors.Is(err, errdefs.ErrOutOfBudget) || b.Used() != 60 {
		t.Fatalf("%v, used %d", err, b.Used())
	}
	if err := b.Charge(-1); !errors.Is(err, errdefs.ErrInvalidArgument) {
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
