package service

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/host"
)

// The status page: GET / renders the deployment's state as plain HTML
// for operators (docs/service.md#the-status-page). It needs the admin
// scope when tokens are configured; since a browser cannot send a bearer
// header on a navigation, POST / takes an admin token once from a form
// and answers with a cookie (HttpOnly, SameSite=Strict) that the service
// accepts on GET / and GET /debug/trace only (RATIONALE.md says why).

//go:embed status.html.tmpl status.js
var statusFiles embed.FS

var (
	statusTemplate = template.Must(template.New("status.html.tmpl").Funcs(template.FuncMap{
		"stateClass": stateClass,
		"summary":    summary,
	}).ParseFS(statusFiles, "status.html.tmpl"))
	statusScript = mustRead("status.js")
	// statusCSP allows the page's one inline script by its hash, inline
	// styles, and fetches of its own origin (the trace); nothing else.
	statusCSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-" + scriptHash(statusScript) +
		"'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

func mustRead(name string) string {
	b, err := statusFiles.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func scriptHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return base64.StdEncoding.EncodeToString(h[:])
}

// OccupancyWindow is the window of the status page's lane occupancy.
const OccupancyWindow = time.Minute

// statusRefresh is the page's default refresh period in seconds.
const statusRefresh = 5

// statusCookie is the cookie that lets a browser see the status page and
// download the trace when tokens are configured.
const (
	statusCookie    = "stagehost_status"
	statusCookieAge = 12 * time.Hour
)

// cookieRoutes are the route patterns a status cookie authorises: both
// read-only, both admin.
var cookieRoutes = map[string]bool{"GET /{$}": true, "GET /debug/trace": true}

// cookieKey signs status cookies. It lives as long as the process: a
// restart signs the operator out.
var cookieKey = func() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}()

// cookieMAC binds a cookie to one admin token (by its SHA-256) and its
// expiry.
func cookieMAC(tokenHash [sha256.Size]byte, exp int64) []byte {
	m := hmac.New(sha256.New, cookieKey)
	m.Write(tokenHash[:])
	m.Write([]byte(strconv.FormatInt(exp, 10)))
	return m.Sum(nil)
}

// newStatusCookie is the value for an admin token's hash: "EXPIRY.MAC".
// It holds neither the token nor anything that authenticates elsewhere.
func newStatusCookie(tokenHash [sha256.Size]byte, now time.Time) string {
	exp := now.Add(statusCookieAge).Unix()
	return strconv.FormatInt(exp, 10) + "." + hex.EncodeToString(cookieMAC(tokenHash, exp))
}

// statusCookieValid reports whether r carries an unexpired status cookie
// made for one of the configured admin tokens.
func (s *Server) statusCookieValid(r *http.Request) bool {
	c, err := r.Cookie(statusCookie)
	if err != nil {
		return false
	}
	expText, macHex, ok := strings.Cut(c.Value, ".")
	exp, err := strconv.ParseInt(expText, 10, 64)
	if !ok || err != nil || time.Now().Unix() > exp {
		return false
	}
	mac, err := hex.DecodeString(macHex)
	if err != nil {
		return false
	}
	good := 0
	for _, h := range s.auth.admin {
		good |= subtle.ConstantTimeCompare(cookieMAC(h, exp), mac)
	}
	return good == 1
}

// authorize is the auth check of a request for a route pattern: its
// bearer token, or a status cookie for the routes that take one.
func (s *Server) authorize(r *http.Request, pattern string) error {
	err := s.auth.check(r, s.scopes[pattern])
	if err != nil && cookieRoutes[pattern] && r.Header.Get("Authorization") == "" && s.statusCookieValid(r) {
		return nil
	}
	return err
}

// signInInstead answers a browser's unauthorised GET / (one without an
// Authorization header that accepts text/html) with the sign-in form, and
// reports whether it did; every other refusal is a JSON error.
func (s *Server) signInInstead(w http.ResponseWriter, r *http.Request, pattern string, err error) bool {
	if pattern != "GET /{$}" || r.Header.Get("Authorization") != "" || !acceptsHTML(r) {
		return false
	}
	s.writeSignIn(w, classStatus(Class(err)), "")
	return true
}

// acceptsHTML reports whether r names text/html in its Accept header, as
// a browser's navigation and form submission do; an API client (curl's
// "*/*", or no Accept at all) gets the JSON errors of every other route.
func acceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/html") && !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0") {
				return true
			}
		}
	}
	return false
}

type signInView struct{ Message string }

func (s *Server) writeSignIn(w http.ResponseWriter, status int, msg string) {
	setPageHeaders(w)
	w.WriteHeader(status)
	_ = statusTemplate.ExecuteTemplate(w, "signin", signInView{Message: msg})
}

func setPageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// statusSignIn is POST /: the sign-in form (token=…) or the sign-out
// button (signout=1).
func (s *Server) statusSignIn(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		s.writeError(w, r, &serviceError{errdefs.ClassPermissionDenied, "a cross-site form may not sign in to the status page"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		s.writeError(w, r, &serviceError{errdefs.ClassInvalidArgument, "the sign-in form is malformed or larger than 4KiB"})
		return
	}
	secure := r.TLS != nil
	if r.PostForm.Get("signout") != "" {
		http.SetCookie(w, &http.Cookie{Name: statusCookie, Value: "", Path: "/", MaxAge: -1,
			HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "./", http.StatusSeeOther)
		return
	}
	if !s.auth.enabled() {
		http.Redirect(w, r, "./", http.StatusSeeOther) // no token is needed
		return
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(r.PostForm.Get("token"))))
	switch {
	case matches(s.auth.admin, h):
		http.SetCookie(w, &http.Cookie{Name: statusCookie, Value: newStatusCookie(h, time.Now()), Path: "/",
			MaxAge: int(statusCookieAge / time.Second), HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "./", http.StatusSeeOther)
	case matches(s.auth.invoke, h):
		if !acceptsHTML(r) {
			s.writeError(w, r, &serviceError{errdefs.ClassPermissionDenied, "the token has scope invoke; the status page needs an admin token"})
			return
		}
		s.writeSignIn(w, http.StatusForbidden, "That token has scope invoke; the status page needs an admin token.")
	default:
		if !acceptsHTML(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="stagehost"`)
			s.writeError(w, r, &serviceError{errdefs.ClassUnauthenticated, "the token is not a valid admin token"})
			return
		}
		s.writeSignIn(w, http.StatusUnauthorized, "That is not a valid admin token.")
	}
}

// --- the page ---

type statusView struct {
	Generated   string
	Refresh     int // seconds; 0: off
	Readiness   deploy.Readiness
	AuthOn      bool // tokens are configured
	ViaCookie   bool // the page was authorised by the status cookie
	Devices     []deviceView
	Supervised  bool        // a supervisor's: Workers are shown
	Workers     []workerRow // a supervisor's workers
	Window      string
	Lanes       []DeviceLanes
	LaneNote    string
	Sessions    []sessionView
	Residents   []residentView
	TraceRecord uint64
	Script      template.JS
}

type deviceView struct {
	Name, Backend, Engine string
	Health, Error         string // "ok" or "lost"; why
}

// sessionView is one session, from its JSON status so that every field
// SessionStatus has is shown, including ones added after this page.
type sessionView struct {
	Name, State, Stage, Device, Reason string
	Calls, Failures                    string
	Outcomes                           []kv
	Details                            []kv // every other field
	Instances                          []instanceView
}

type instanceView struct {
	Label, State, Device, Reason string
	Details                      []kv
}

// kv is a field shown as K=V; Full is V when V is shortened for reading
// (a hash), "" otherwise.
type kv struct{ K, V, Full string }

type residentView struct {
	Name, GPU, NPU      string
	Rounds, MaxRuns     int
	Running, Shown, All int
	Runs                []runView
}

type runView struct {
	ID                       int
	State, Started, Duration string
	Verified                 bool
	Error                    string
}

// residentRunsShown bounds the runs the page lists per resident, newest
// first; /v1/residents/{name} has them all.
const residentRunsShown = 20

func (s *Server) statusPage(w http.ResponseWriter, r *http.Request) {
	refresh := statusRefresh
	if v := r.URL.Query().Get("refresh"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 3600 {
			refresh = n
		}
	}
	now := time.Now()
	v := statusView{Generated: now.Format("2006-01-02 15:04:05 MST"), Refresh: refresh, Readiness: s.Readiness(),
		AuthOn: s.auth.enabled(), Window: OccupancyWindow.String(), Script: template.JS(statusScript)}
	v.ViaCookie = v.AuthOn && r.Header.Get("Authorization") == ""
	labels := map[string]string{} // the device's own name → its manifest name
	var order []string
	v.Devices = s.statusDevices()
	for i := range s.d.Manifest.Devices {
		md := &s.d.Manifest.Devices[i]
		if dev := s.d.Device(md.Name); dev != nil {
			labels[dev.Name()] = md.Name
		}
		order = append(order, md.Name)
	}
	wk := s.workersOf()
	if wk != nil {
		v.Supervised, v.Workers = true, workerRows(wk.WorkerStatus())
	}
	tr := s.d.Runtime.Tracer()
	recs := tr.Records()
	v.TraceRecord = tr.Total()
	for i := range recs {
		if name, ok := labels[recs[i].Device]; ok {
			recs[i].Device = name
		}
	}
	v.Lanes = LaneOccupancy(recs, now, OccupancyWindow, order)
	if v.TraceRecord > uint64(len(recs)) && len(recs) > 0 && recs[0].Start.After(now.Add(-OccupancyWindow)) {
		v.LaneNote = fmt.Sprintf("The trace ring (runtime.trace_buffer, %d records) holds only the last %v: the shares below are lower bounds.",
			len(recs), now.Sub(recs[0].Start).Round(time.Millisecond))
	}
	for _, st := range s.d.Statuses() {
		v.Sessions = append(v.Sessions, sessionFromStatus(st))
	}
	if wk != nil {
		v.Sessions = supervisorSessionViews(wk)
	}
	for _, name := range s.d.ResidentNames() {
		res := s.d.Resident(name)
		runs := res.Runs()
		rv := residentView{Name: name, GPU: res.Spec.GPU, NPU: res.Spec.NPU, Rounds: res.Spec.Rounds,
			MaxRuns: res.Spec.MaxRuns, Running: res.Running(), All: len(runs)}
		for i := len(runs) - 1; i >= 0 && len(rv.Runs) < residentRunsShown; i-- {
			run := runs[i]
			dur := ""
			if run.Duration > 0 {
				dur = roundDuration(run.Duration)
			}
			rv.Runs = append(rv.Runs, runView{ID: run.ID, State: run.State, Started: run.Started.Format("15:04:05.000"),
				Duration: dur, Verified: run.Verified, Error: run.Error})
		}
		rv.Shown = len(rv.Runs)
		v.Residents = append(v.Residents, rv)
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, v); err != nil {
		s.writeError(w, r, fmt.Errorf("rendering the status page: %w", err))
		return
	}
	setPageHeaders(w)
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
}

// sessionFromStatus converts a status through its JSON form, so that
// fields this page does not know are shown too.
func sessionFromStatus(st deploy.SessionStatus) sessionView {
	b, _ := json.Marshal(st)
	return sessionFromJSON(b)
}

// sessionFromJSON converts a session's JSON status.
func sessionFromJSON(b []byte) sessionView {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	_ = dec.Decode(&m)
	take := func(k string) string {
		v, ok := m[k]
		delete(m, k)
		if !ok {
			return ""
		}
		return formatValue(v)
	}
	sv := sessionView{Name: take("name"), State: take("state"), Stage: take("stage"), Device: take("device"),
		Reason: take("reason"), Calls: take("calls"), Failures: take("failures")}
	if o, ok := m["outcomes"].(map[string]any); ok {
		sv.Outcomes = sortedKV(o)
	}
	delete(m, "outcomes")
	if list, ok := m["instances"].([]any); ok {
		for _, it := range list {
			im, ok := it.(map[string]any)
			if !ok {
				continue
			}
			iv := instanceView{}
			if idx, ok := im["index"]; ok {
				iv.Label = "instance " + formatValue(idx)
			}
			for _, k := range []string{"index", "state", "device", "reason"} {
				if v, ok := im[k]; ok {
					switch k {
					case "state":
						iv.State = formatValue(v)
					case "device":
						iv.Device = formatValue(v)
					case "reason":
						iv.Reason = formatValue(v)
					}
					delete(im, k)
				}
			}
			iv.Details = sortedKV(im)
			sv.Instances = append(sv.Instances, iv)
		}
		delete(m, "instances")
		if len(sv.Instances) == 1 {
			sv.Instances = nil // one instance: the session's row says it all
		}
	}
	sv.Details = sortedKV(m)
	return sv
}

// sortedKV lists m's fields by name, without empty ones; a long hex
// value (a hash) is shortened, with the whole in Full.
func sortedKV(m map[string]any) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		f := formatValue(v)
		switch {
		case f == "" || f == "[]":
			continue
		case len(f) > 16 && strings.Trim(f, "0123456789abcdef") == "":
			out = append(out, kv{k, f[:12] + "…", f})
		default:
			out = append(out, kv{K: k, V: f})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K < out[j].K })
	return out
}

func formatValue(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	case map[string]any:
		parts := []string{}
		for _, p := range sortedKV(v) {
			parts = append(parts, p.K+"="+p.V)
		}
		return strings.Join(parts, ", ")
	case []any:
		parts := []string{}
		for _, e := range v {
			parts = append(parts, formatValue(e))
		}
		return "[" + strings.Join(parts, "; ") + "]"
	}
	return fmt.Sprint(v)
}

// stateClass maps a state to one of a fixed set of CSS classes: green
// for the good states, red for the bad, amber for the passing ones.
func stateClass(state string) string {
	switch state {
	case "ready", "verified", "ok":
		return "good"
	case "quarantined", "failed", "lost", "not_ready", "refused":
		return "bad"
	case "":
		return ""
	}
	return "busy"
}

// summary is a reason's first line, without a Wasm stack trace: the
// page shows it, and the whole text when it is opened.
func summary(reason string) string {
	if s := deploy.PublicMessage(&serviceError{msg: reason}); s != "" {
		return s
	}
	return reason
}

func roundDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// DeviceLanes is one device's lane occupancy over a window.
type DeviceLanes struct {
	Device string
	Lanes  [host.NumLanes]LaneOccupancyShare
}

// LaneOccupancyShare is one lane's occupancy over a window.
type LaneOccupancyShare struct {
	Lane   string
	Share  float64       // of the window during which the lane had at least one occupant, 0..1
	Busy   time.Duration // that time
	Count  int           // occupancies that overlap the window
	Failed int           // of which failed
}

// Percent is Share in percent for reading, with one decimal; "<0.1"
// for a lane busy, but for less than 0.1% (it is not shown as idle).
func (l LaneOccupancyShare) Percent() string {
	p := 100 * l.Share
	if p > 0 && p < 0.05 {
		return "<0.1"
	}
	return strconv.FormatFloat(p, 'f', 1, 64)
}

// Width is Share in percent for a CSS width.
func (l LaneOccupancyShare) Width() string { return strconv.FormatFloat(100*l.Share, 'f', 3, 64) }

// BusyText is Busy, rounded for reading.
func (l LaneOccupancyShare) BusyText() string { return roundDuration(l.Busy) }

// LaneOccupancy computes each device's lane occupancy over the window
// that ends at now from trace records: the share of the window during
// which each lane had at least one occupant (overlapping occupancies of a
// lane count once). Devices come in order, then any other device the
// records name, sorted ("runtime" for a record without a device). A
// record still running is not in the trace yet; one that began before
// the window counts only for its part inside it.
func LaneOccupancy(records []host.Record, now time.Time, window time.Duration, order []string) []DeviceLanes {
	from := now.Add(-window)
	type span struct{ a, b time.Time }
	spans := map[string]*[host.NumLanes][]span{}
	counts := map[string]*[host.NumLanes][2]int{}
	get := func(dev string) (*[host.NumLanes][]span, *[host.NumLanes][2]int) {
		if spans[dev] == nil {
			spans[dev], counts[dev] = new([host.NumLanes][]span), new([host.NumLanes][2]int)
		}
		return spans[dev], counts[dev]
	}
	for _, dev := range order {
		get(dev)
	}
	for _, r := range records {
		if int(r.Lane) >= host.NumLanes {
			continue
		}
		dev := r.Device
		if dev == "" {
			dev = "runtime"
		}
		sp, cn := get(dev)
		a, b := r.Start, r.Start.Add(r.Dur)
		if !b.After(from) || a.After(now) {
			continue
		}
		if a.Before(from) {
			a = from
		}
		if b.After(now) {
			b = now
		}
		sp[r.Lane] = append(sp[r.Lane], span{a, b})
		cn[r.Lane][0]++
		if r.Failed {
			cn[r.Lane][1]++
		}
	}
	seen := map[string]bool{}
	var names []string
	for _, dev := range order {
		if !seen[dev] {
			seen[dev] = true
			names = append(names, dev)
		}
	}
	var extra []string
	for dev := range spans {
		if !seen[dev] {
			extra = append(extra, dev)
		}
	}
	sort.Strings(extra)
	names = append(names, extra...)
	out := make([]DeviceLanes, 0, len(names))
	for _, dev := range names {
		dl := DeviceLanes{Device: dev}
		for l := range host.NumLanes {
			ss := spans[dev][l]
			sort.Slice(ss, func(i, j int) bool { return ss[i].a.Before(ss[j].a) })
			var busy time.Duration
			var cur span
			for i, sp := range ss {
				switch {
				case i == 0:
					cur = sp
				case !sp.a.After(cur.b):
					if sp.b.After(cur.b) {
						cur.b = sp.b
					}
				default:
					busy += cur.b.Sub(cur.a)
					cur = sp
				}
			}
			if len(ss) > 0 {
				busy += cur.b.Sub(cur.a)
			}
			share := 0.0
			if window > 0 {
				share = min(float64(busy)/float64(window), 1)
			}
			dl.Lanes[l] = LaneOccupancyShare{Lane: host.Lane(l).String(), Share: share, Busy: busy,
				Count: counts[dev][l][0], Failed: counts[dev][l][1]}
		}
		out = append(out, dl)
	}
	return out
}
