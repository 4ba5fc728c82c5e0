package service

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// TestCallContext: Stagehost-Deadline shortens a session's manifest
// deadline and never lengthens it; with no manifest deadline known (a
// session of another host) it applies as it is; a malformed one is an
// invalid_argument error.
func TestCallContext(t *testing.T) {
	for _, c := range []struct {
		header   string
		manifest time.Duration
		want     time.Duration // 0: no deadline from the header
	}{
		{"", time.Second, 0},
		{"50ms", time.Second, 50 * time.Millisecond},
		{"1h", time.Second, 0}, // never lengthens
		{"1s", time.Second, 0}, // equal: the manifest's applies
		{"1h", 0, time.Hour},   // another host's session: as it is
		// Past what a Go duration holds: longer than any deadline.
		{"9999999h", time.Second, 0},
		{"100000000000000000000s", time.Second, 0},
	} {
		r := httptest.NewRequest("POST", "/v1/sessions/x/run", nil)
		if c.header != "" {
			r.Header.Set(DeadlineHeader, c.header)
		}
		ctx, cancel, err := callContext(r, c.manifest)
		if err != nil {
			t.Fatalf("%q over %v: %v", c.header, c.manifest, err)
		}
		dl, ok := ctx.Deadline()
		switch {
		case c.want == 0 && ok:
			t.Errorf("%q over %v: a deadline in %v, want none from the header", c.header, c.manifest, time.Until(dl))
		case c.want != 0 && (!ok || time.Until(dl) > c.want || time.Until(dl) < c.want-time.Second):
			t.Errorf("%q over %v: deadline %v (set %v), want about %v", c.header, c.manifest, time.Until(dl), ok, c.want)
		}
		cancel()
	}
	for _, bad := range []string{"soon", "0s", "-1s", "-9999999h", "9999999parsecs", "99999999999999999999"} {
		r := httptest.NewRequest("POST", "/v1/sessions/x/run", nil)
		r.Header.Set(DeadlineHeader, bad)
		if _, _, err := callContext(r, time.Second); Class(err) != errdefs.ClassInvalidArgument {
			t.Errorf("%q: %v, want invalid_argument", bad, err)
		}
	}
}
