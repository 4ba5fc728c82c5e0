package hw

import (
	"fmt"
	"sync/atomic"

	"github.com/stagehost/stagehost/errdefs"
)

// Budget is a memory budget. Allocations charge it and frees release the
// charge. A nil *Budget is unlimited and records nothing. Budgets are safe
// for concurrent use.
type Budget struct {
	name  string
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes. A limit ≤ 0 means unlimited
// but still counted.
func NewBudget(name string, limit int64) *Budget {
	return &Budget{name: name, limit: limit}
}

// Charge reserves n bytes.
//
// # Errors
//
// [errdefs.ErrOutOfBudget] when the charge would exceed the limit; nothing is
// charged then. [errdefs.ErrInvalidArgument] for a negative n.
func (b *Budget) Charge(n int64) error {
	if b == nil {
		return nil
	}
	if n < 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "budget %q: negative charge %d", b.name, n)
	}
	for {
		used := b.used.Load()
		if b.limit > 0 && used+n > b.limit {
			return errdefs.Errorf(errdefs.ErrOutOfBudget, "budget %q: %d bytes requested, %d of %d in use", b.name, n, used, b.limit)
		}
		if b.used.CompareAndSwap(used, used+n) {
			return nil
		}
	}
}

// Release returns n bytes charged earlier.
func (b *Budget) Release(n int64) {
	if b == nil {
		return
	}
	if b.used.Add(-n) < 0 {
		panic(fmt.Sprintf("hw: budget %q released more than it charged", b.name))
	}
}

// Used reports the bytes currently charged.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Limit reports the limit in bytes (≤ 0: unlimited).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// Name is the budget's name, for messages.
func (b *Budget) Name() string {
	if b == nil {
		return ""
	}
	return b.name
}
