package deadline

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestArmIgnoresTheParentsCancellation(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	var c Context
	c.Arm(parent, time.Now().Add(time.Hour))
	cancel()
	if err := c.Err(); err != nil {
		t.Fatalf("Err = %v after the parent was cancelled; Arm must ignore it", err)
	}
	c.Disarm()
}

func TestArmWithCancelEndsWithTheParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	var c Context
	c.ArmWithCancel(parent, time.Now().Add(time.Hour))
	done := c.Done()
	cancel()
	<-done
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want context.Canceled", c.Err())
	}
	// A new use starts afresh.
	c.ArmWithCancel(context.Background(), time.Now().Add(time.Hour))
	if err := c.Err(); err != nil {
		t.Fatalf("re-armed context reports %v", err)
	}
	c.Disarm()
}

func TestDeadlinePassedIsReportedWithoutWaiting(t *testing.T) {
	var c Context
	c.Arm(context.Background(), time.Now().Add(-time.Millisecond))
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
	}
	<-c.Done()
	c.Disarm()
}

func TestArmWithCancelTakesTheEarlierDeadline(t *testing.T) {
	want := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	var c Context
	c.ArmWithCancel(parent, want.Add(time.Hour))
	if d, _ := c.Deadline(); !d.Equal(want) {
		t.Fatalf("Deadline = %v, want the parent's %v", d, want)
	}
	c.Disarm()
}

func TestArmAllocatesNothing(t *testing.T) {
	var c Context
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c.ArmWithCancel(ctx, time.Now().Add(time.Second))
		_ = c.Err()
		c.Disarm()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per use, want 0", allocs)
	}
}
