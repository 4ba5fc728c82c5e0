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
	out := t.all()
	if len(out) > StderrTailLines {
		out = out[len(out)-StderrTailLines:]
	}
	return out
}

// all returns every non-empty line of the last StderrTailBytes bytes
// written, oldest first, each at most 1 KiB.
func (t *tailWriter) all() []string {
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
	return out
}

// reasonLine is the line of the last StderrTailBytes bytes written that
// best says why the process ended: the last one that is not a log line
// at level INFO or DEBUG (slog's text or JSON format), so a warning, an
// error or a line that is no log line at all ("stagehost serve: …", a
// panic); the last line when every one is; "" if none.
func (t *tailWriter) reasonLine() string {
	all := t.all()
	for i := len(all) - 1; i >= 0; i-- {
		if !routineLogLine(all[i]) {
			return all[i]
		}
	}
	if n := len(all); n > 0 {
		return all[n-1]
	}
	return ""
}

// routineLogLine says whether l is a log line at level INFO or DEBUG, in
// slog's text format (level=INFO, level=DEBUG-4) or its JSON format
// ("level":"INFO").
func routineLogLine(l string) bool {
	for _, lvl := range []string{"INFO", "DEBUG"} {
		if strings.Contains(l, " level="+lvl) || strings.HasPrefix(l, "level="+lvl) || strings.Contains(l, `"level":"`+lvl) {
			return true
		}
	}
	return false
}
