package service_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/service"
)

// TestStatusPageShowsEverySection: devices, lanes of every device,
// sessions with their state and reason, resident runs, and the trace
// links, in one HTML page with a strict CSP.
func TestStatusPageShowsEverySection(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	for range 3 {
		if rec := s.do("POST", "/v1/sessions/steady/run", nil); rec.Code != 200 {
			t.Fatalf("steady: %d %s", rec.Code, rec.Body)
		}
	}
	s.do("POST", "/v1/sessions/trap/run", nil)
	if rec := s.do("POST", "/v1/sessions/liar/run", nil); rec.Code != 503 {
		t.Fatalf("liar: %d %s", rec.Code, rec.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.d.Resident("pp").Run(ctx); err != nil {
		t.Fatal(err)
	}

	rec := s.do("GET", "/", nil)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %v\n%s", rec.Code, rec.Header(), rec.Body)
	}
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'sha256-") || strings.Contains(csp, "script-src 'unsafe-inline'") {
		t.Errorf("CSP %q", csp)
	}
	page := rec.Body.String()
	for _, want := range []string{
		`<h2>Devices</h2>`, `<td>gpu0</td><td>sim</td><td>gpu</td><td><span class="state good">ok</span>`,
		`<td>npu0</td><td>sim</td><td>npu</td>`,
		`<h2>Lane occupancy, last 1m0s</h2>`,
		`data-device="gpu0" data-lane="compute"`, `data-device="gpu0" data-lane="upload"`,
		`data-device="gpu1" data-lane="download"`, `data-device="npu0" data-lane="npu"`,
		`data-session="steady" data-state="ready"`, `data-session="liar" data-state="quarantined"`,
		`<span class="state bad">quarantined</span>`, `<span class="state good">ready</span>`,
		`<span class="kv goodtext">ok&nbsp;3</span>`, `<span class="kv badtext">fault&nbsp;1</span>`,
		`<h3 class="resident" data-resident="pp">`, `<tr class="run" data-state="verified">`,
		`href="debug/trace" download="stagehost-trace.json"`, `id="open-perfetto"`,
		`<p id="readiness" class="readiness bad">Readiness: <strong>not_ready</strong><br>session liar is quarantined`,
		`<noscript><meta http-equiv="refresh" content="5"></noscript>`, `data-refresh="5"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	// The steady session's calls occupied gpu0's compute lane within the
	// last minute.
	m := regexp.MustCompile(`data-device="gpu0" data-lane="compute">.*?style="width: ([0-9.]+)%".*?<td class="num">([0-9]+)</td>`).FindStringSubmatch(page)
	if m == nil || m[2] == "0" {
		t.Errorf("gpu0 compute row: %q", m)
	}
	// The script the page carries is the one its CSP allows.
	if !strings.Contains(page, "<script>\n// The status page's one script") {
		t.Errorf("no script")
	}

	rec = s.do("GET", "/?refresh=0", nil)
	if strings.Contains(rec.Body.String(), `http-equiv="refresh"`) || !strings.Contains(rec.Body.String(), `data-refresh="0"`) {
		t.Errorf("refresh=0 still refreshes")
	}
	if rec := s.do("HEAD", "/", nil); rec.Code != 200 {
		t.Errorf("HEAD /: %d", rec.Code)
	}
	if rec := s.do("DELETE", "/", nil); rec.Code != 405 {
		t.Errorf("DELETE /: %d", rec.Code)
	}
	if rec := s.do("GET", "/nowhere", nil); rec.Code != 404 {
		t.Errorf("GET /nowhere: %d (the page is at / only)", rec.Code)
	}
}

// TestStatusPageAuth: with tokens, the page needs the admin scope: a
// bearer token, or the cookie POST / gives for an admin token, which
// opens only GET / and GET /debug/trace.
func TestStatusPageAuth(t *testing.T) {
	const admin, invoke = "admin-token-0123456789", "invoke-token-0123456789"
	s := serveHostile(t, "", "", func(c *service.Config) {
		c.AdminTokens, c.InvokeTokens = []string{admin}, []string{invoke}
	})
	// A browser (Accept names text/html) without credentials gets the
	// sign-in form.
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	rec := s.do("GET", "/", nil, "Accept", browser)
	if rec.Code != 401 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(rec.Body.String(), `<input type="password" name="token"`) || strings.Contains(rec.Body.String(), "gpu0") {
		t.Fatalf("GET / without a token: %d %v\n%s", rec.Code, rec.Header(), rec.Body)
	}
	// An API client (no Accept, or curl's */*) gets the JSON errors of
	// every route, as does a bearer client.
	for _, accept := range []string{"", "*/*", "application/json", "text/html;q=0"} {
		rec := s.do("GET", "/", nil, "Accept", accept)
		if rec.Code != 401 || errorBody(t, rec).Class != "unauthenticated" || rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("GET / without a token, Accept %q: %d %v\n%s", accept, rec.Code, rec.Header(), rec.Body)
		}
	}
	if rec := s.do("GET", "/", nil, "Authorization", "Bearer "+invoke); rec.Code != 403 || errorBody(t, rec).Class != "permission_denied" {
		t.Errorf("invoke token: %d %s", rec.Code, rec.Body)
	}
	if rec := s.do("GET", "/", nil, "Authorization", "Bearer "+admin); rec.Code != 200 || !strings.Contains(rec.Body.String(), "gpu0") {
		t.Errorf("admin token: %d", rec.Code)
	}

	form := func(v url.Values, header ...string) *http.Response {
		rec := s.do("POST", "/", strings.NewReader(v.Encode()), append([]string{"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
		return rec.Result()
	}
	if r := form(url.Values{"token": {"wrong-token-0123456789"}}); r.StatusCode != 401 || len(r.Cookies()) != 0 {
		t.Errorf("a wrong token: %d %v", r.StatusCode, r.Cookies())
	}
	if r := form(url.Values{"token": {invoke}}); r.StatusCode != 403 || len(r.Cookies()) != 0 {
		t.Errorf("an invoke token: %d %v", r.StatusCode, r.Cookies())
	}
	// The form's refusals: JSON for an API client, the form again (HTML)
	// for a browser.
	for _, tc := range []struct {
		token, accept string
		code          int
		class, html   string
	}{
		{invoke, "", 403, "permission_denied", ""},
		{invoke, "*/*", 403, "permission_denied", ""},
		{"wrong-token-0123456789", "", 401, "unauthenticated", ""},
		{invoke, browser, 403, "", "scope invoke"},
		{"wrong-token-0123456789", browser, 401, "", "not a valid admin token"},
	} {
		rec := s.do("POST", "/", strings.NewReader(url.Values{"token": {tc.token}}.Encode()),
			"Content-Type", "application/x-www-form-urlencoded", "Accept", tc.accept)
		ct := rec.Header().Get("Content-Type")
		switch {
		case rec.Code != tc.code:
			t.Errorf("form %s, Accept %q: %d, want %d", tc.token[:6], tc.accept, rec.Code, tc.code)
		case tc.class != "" && (ct != "application/json" || errorBody(t, rec).Class != tc.class):
			t.Errorf("form %s, Accept %q: %s\n%s, want JSON class %s", tc.token[:6], tc.accept, ct, rec.Body, tc.class)
		case tc.html != "" && (!strings.HasPrefix(ct, "text/html") || !strings.Contains(rec.Body.String(), tc.html)):
			t.Errorf("form %s, Accept %q: %s\n%s, want the form", tc.token[:6], tc.accept, ct, rec.Body)
		}
	}
	if r := form(url.Values{"token": {admin}}, "Sec-Fetch-Site", "cross-site"); r.StatusCode != 403 || len(r.Cookies()) != 0 {
		t.Errorf("a cross-site sign-in: %d %v", r.StatusCode, r.Cookies())
	}
	r := form(url.Values{"token": {admin}})
	if r.StatusCode != 303 || len(r.Cookies()) != 1 {
		t.Fatalf("an admin token: %d %v", r.StatusCode, r.Cookies())
	}
	c := r.Cookies()[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.MaxAge <= 0 || strings.Contains(c.Value, admin) {
		t.Errorf("cookie %+v", c)
	}
	cookie := c.Name + "=" + c.Value
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/", 200},
		{"GET", "/debug/trace", 200},
		{"GET", "/metrics", 401},
		{"GET", "/v1/sessions", 401},
		{"POST", "/v1/sessions/steady/run", 401},
		{"GET", "/v1/residents/pp", 401},
		{"POST", "/v1/residents/pp/start", 401},
	} {
		if rec := s.do(tc.method, tc.path, nil, "Cookie", cookie); rec.Code != tc.code {
			t.Errorf("%s %s with the cookie: %d, want %d", tc.method, tc.path, rec.Code, tc.code)
		}
	}
	if rec := s.do("GET", "/", nil, "Cookie", cookie); !strings.Contains(rec.Body.String(), `name="signout"`) {
		t.Errorf("no sign-out button")
	}
	// A cookie altered in any way is refused.
	exp, mac, _ := strings.Cut(c.Value, ".")
	for _, bad := range []string{c.Name + "=" + exp + "0." + mac, c.Name + "=" + exp + "." + strings.Repeat("0", len(mac)), c.Name + "=x", "other=" + c.Value} {
		if rec := s.do("GET", "/", nil, "Cookie", bad); rec.Code != 401 {
			t.Errorf("cookie %q: %d", bad, rec.Code)
		}
	}
	if r := form(url.Values{"signout": {"1"}}); r.StatusCode != 303 || len(r.Cookies()) != 1 || r.Cookies()[0].MaxAge >= 0 {
		t.Errorf("sign out: %d %v", r.StatusCode, r.Cookies())
	}
}

func TestStatusPageWithoutTokens(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	if rec := s.do("POST", "/", strings.NewReader("token=x"), "Content-Type", "application/x-www-form-urlencoded"); rec.Code != 303 {
		t.Errorf("POST / without tokens: %d", rec.Code)
	}
	if rec := s.do("GET", "/", nil); rec.Code != 200 || strings.Contains(rec.Body.String(), `name="signout"`) {
		t.Errorf("GET /: %d", rec.Code)
	}
}

func TestLaneOccupancy(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	recs := []host.Record{
		// gpu0 compute: 10s..20s ago and 15s..25s ago overlap: 15s busy.
		{Start: at(25 * time.Second), Dur: 10 * time.Second, Lane: host.LaneCompute, Device: "gpu0"},
		{Start: at(20 * time.Second), Dur: 10 * time.Second, Lane: host.LaneCompute, Device: "gpu0", Failed: true},
		// gpu0 upload: began 70s ago, ended 50s ago: 10s inside.
		{Start: at(70 * time.Second), Dur: 20 * time.Second, Lane: host.LaneUpload, Device: "gpu0"},
		// entirely before the window: not counted.
		{Start: at(90 * time.Second), Dur: 5 * time.Second, Lane: host.LaneDownload, Device: "gpu0"},
		// another device, and none.
		{Start: at(30 * time.Second), Dur: 30 * time.Second, Lane: host.LaneNPU, Device: "zz"},
		{Start: at(6 * time.Second), Dur: 6 * time.Second, Lane: host.LaneCompute},
		// 1ms of 1m: busy, but under 0.1%.
		{Start: at(time.Second), Dur: time.Millisecond, Lane: host.LaneDownload, Device: "gpu1"},
	}
	got := service.LaneOccupancy(recs, now, time.Minute, []string{"gpu0", "gpu1"})
	if len(got) != 4 || got[0].Device != "gpu0" || got[1].Device != "gpu1" || got[2].Device != "runtime" || got[3].Device != "zz" {
		t.Fatalf("devices: %+v", got)
	}
	check := func(d service.DeviceLanes, l host.Lane, pct string, count, failed int) {
		t.Helper()
		o := d.Lanes[l]
		if o.Lane != l.String() || o.Percent() != pct || o.Count != count || o.Failed != failed {
			t.Errorf("%s %s: %+v (%s%%), want %s%% %d %d", d.Device, l, o, o.Percent(), pct, count, failed)
		}
	}
	check(got[0], host.LaneCompute, "25.0", 2, 1)
	check(got[0], host.LaneUpload, "16.7", 1, 0)
	check(got[0], host.LaneDownload, "0.0", 0, 0)
	check(got[1], host.LaneCompute, "0.0", 0, 0)
	check(got[1], host.LaneDownload, "<0.1", 1, 0)
	check(got[2], host.LaneCompute, "10.0", 1, 0)
	check(got[3], host.LaneNPU, "50.0", 1, 0)
}

// GET /v1/status of a single process: its readiness, devices and
// sessions as the page shows them, and no workers.
func TestStatusJSON(t *testing.T) {
	s := serveHostile(t, "", "", nil)
	if rec := s.do("POST", "/v1/sessions/liar/run", nil); rec.Code != 503 {
		t.Fatalf("liar: %d %s", rec.Code, rec.Body)
	}
	rec := s.do("GET", "/v1/status", nil)
	var st struct {
		Readiness struct{ Status string }
		Devices   []struct{ Name, Health string }
		Sessions  []struct{ Name, State string }
		Workers   []any
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &st) != nil {
		t.Fatalf("GET /v1/status: %d %s", rec.Code, rec.Body)
	}
	states := map[string]string{}
	for _, x := range st.Sessions {
		states[x.Name] = x.State
	}
	if st.Readiness.Status == "" || len(st.Devices) == 0 || st.Devices[0].Health != "ok" || states["liar"] != "quarantined" || states["steady"] != "ready" || st.Workers != nil {
		t.Errorf("GET /v1/status: %s", rec.Body)
	}
}
