package supervise

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// The end of a worker's stderr the supervisor keeps for its exit record
// ([Exit.Stderr]).
const (
	StderrTailLines = 5
	StderrTailBytes = 4 << 10
)

// tailWriter passes everything to w and keeps the last StderrTailBytes
// bytes written, to give the last lines of a process that died.
type tailWriter struct {
	w   io.Writer
	mu  sync.Mutex
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	if n := len(t.buf); n > 2*StderrTailBytes {
		t.buf = append(t.buf[:0], t.buf[n-StderrTailBytes:]...)
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

// lines returns the last non-empty lines kept, oldest first, each at
// most 1 KiB; nil if none.
func (t *tailWriter) lines() []string {
	t.mu.Lock()
	b := t.buf
	if len(b) > StderrTailBytes {
		b = b[len(b)-StderrTailBytes:]
	}
	b = bytes.Clone(b)
	t.mu.Unlock()
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, truncate(l, 1024))
		}
	}
	if len(out) > StderrTailLines {
		out = out[len(out)-StderrTailLines:]
	}
	return out
}
