// Package a has good and bad doc links. Good: [Local], [Local.Method],
// [Local.Field], [b.T], [b.T.M], [*b.T], [b.T.F], [b.I.Do], [b.Const],
// [b], [a], [errors.Is], [context.Context.Done], [c.Exported],
// [example.com/ws/b.T], [io.Reader]. Prose, not links: x[i], [j],
// [lo, hi], a TOML [table], [unexported].
//
// Code is not checked:
//
//	[Missing] in a code block
package a

import (
	"io"

	"example.com/other/c"
	"example.com/ws/b"
)

var _ io.Reader
var _ = c.Exported
var _ b.T

// Local is a type.
type Local struct{ Field int }

// Method is a method. Bad: [Gone], [Local.Gone], [b.Gone],
// [b.T.Gone], [errors.Gone], [nope.Thing],
// [example.com/ws/nothere.T], [Gone.Method].
func (Local) Method() {}

// Bad links in a comment inside a function count too.
func f() {
	// See [AlsoGone].
}
