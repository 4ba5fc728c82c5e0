package manifest

import (
	"sort"
	"strconv"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
)

// Error is one problem found in a manifest.
//
// It belongs to an [hw] error class: [errdefs.ErrNotFound] for a file that
// cannot be read, the class [stages.Validate] gave for a module check
// (usually [errdefs.ErrInvalidArgument], [errdefs.ErrUnsupported] for another ABI
// version), and [errdefs.ErrInvalidArgument] for everything else, so
// errors.Is(err, errdefs.ErrInvalidArgument) works on it and on [*Errors].
//
// Msg quotes every string it takes from the manifest, and every path made
// from one, as %q does, and escapes what else could not be printed (in
// the TOML parser's and the module checks' messages): no value in a
// manifest can put a line break, a terminal escape or another
// unprintable character into an error (docs/manifest.md).
type Error struct {
	File string // the manifest's name, as given to Load or Decode
	Line int    // 1-based line; 0 when no line applies
	Key  string // key path, such as session[1].buffer[0].size; "" for none
	Msg  string

	class error
}

// Error formats the error as FILE:LINE: KEY: MESSAGE, leaving out
// ":LINE" when Line is 0 and "KEY: " when Key is empty.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the error's [hw] class.
func (e *Error) Unwrap() error {
	if e.class == nil {
		return errdefs.ErrInvalidArgument
	}
	return e.class
}

// Errors is every problem found in one manifest, sorted by line. [Load]
// and [Decode] return one (never empty) whenever they fail.
type Errors struct {
	List []*Error
}

// Error formats each error on its own line.
func (e *Errors) Error() string {
	s := make([]string, len(e.List))
	for i, err := range e.List {
		s[i] = err.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap returns the errors, for [errors.Is] and [errors.As].
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, err := range e.List {
		out[i] = err
	}
	return out
}

// sortErrors orders errors by line, keeping the order in which they were
// found within a line, and drops exact duplicates.
func sortErrors(list []*Error) []*Error {
	sort.SliceStable(list, func(i, j int) bool { return list[i].Line < list[j].Line })
	out := list[:0]
	seen := map[string]bool{}
	for _, e := range list {
		k := e.Error()
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	return out
}
