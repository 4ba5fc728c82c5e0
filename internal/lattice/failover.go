package lattice

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Failover settings of a member's NATS connection ([ConnOptions]):
// docs/lattice.md, "A NATS cluster".
const (
	// PingInterval: the client pings its server after this long without
	// traffic, and counts the server dead (and reconnects to another)
	// once MaxPingsOutstanding pings are unanswered: a server that is
	// stopped or cut off is left within about 3 s (nats.go's default,
	// 2 minutes, would hold every call for that long).
	PingInterval        = time.Second
	MaxPingsOutstanding = 2
	// ReconnectBufSize is how many bytes a member publishes while it
	// reconnects (answers, acknowledgements, heartbeats): they are sent
	// once it is connected again. nats.go's default.
	ReconnectBufSize = 8 << 20
	// DialTimeout bounds one attempt to connect to one server.
	DialTimeout = time.Second
)

// ReconnectDelay is how long a member waits before it tries the servers
// of its URL list again once it has tried every one of them (attempts
// counts such passes, from 1): 25 ms doubling to 1 s. A server that went
// away is replaced by another of the list at once, without a wait.
func ReconnectDelay(attempts int) time.Duration {
	d := 25 * time.Millisecond
	for i := 1; i < attempts && d < time.Second; i++ {
		d *= 2
	}
	return min(d, time.Second)
}

// ConnOptions are the options of a member's NATS connection for
// failover over a NATS cluster: reconnect for ever ([ReconnectDelay]),
// detect a dead server within about 3 s ([PingInterval]), keep what it
// publishes meanwhile ([ReconnectBufSize]). [Join] uses them; a caller
// that connects by hand passes them with its own.
func ConnOptions() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.CustomReconnectDelay(ReconnectDelay),
		nats.PingInterval(PingInterval), nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.ReconnectBufSize(ReconnectBufSize), nats.Timeout(DialTimeout)}
}

// BeatSubject is where host id publishes its heartbeat over core NATS
// (the record, as in the hosts bucket), at each beat: a front's liveness
// of the hosts follows these, so that it does not depend on JetStream
// (whose streams stop for 4 to 9 s while a lost leader is replaced).
func BeatSubject(lattice, id string) string { return "stagehost." + lattice + ".beat." + id }

// CallStatusSubject is where host id answers whether it is running a
// call (the request's body: the call's id): CallStatusHeader "running"
// or "unknown" (not running it: answered, never taken, or not this
// host's).
func CallStatusSubject(lattice, id string) string {
	return "stagehost." + lattice + ".host." + id + ".calls"
}

// AnswerLostMessage begins the message of a call's 504
// deadline_exceeded error when its answer was lost with a NATS
// connection: the host acknowledged the call and, asked after the
// connection came back, was no longer running it. The call may have
// run (it usually has). The host's id ends the message.
const AnswerLostMessage = "the answer was lost with a dropped NATS connection, and the call may have run, on host "

// CallWhoSubject is where every host of a lattice answers, if it has
// acknowledged a call (the request's body: its id), "running" or
// "answered" (CallStatusHeader), and is silent otherwise: a front asks
// it before it sends again a call no host acknowledged, in case the
// acknowledgement was lost with a connection.
func CallWhoSubject(lattice string) string { return "stagehost." + lattice + ".calls.who" }

// A front waits a quarter of its AckTimeout (at least minWhoWindow) for
// an answer on CallWhoSubject before it sends the call again.
const minWhoWindow = 50 * time.Millisecond

// CallStatusHeader is on a host's answer to a call status request.
const CallStatusHeader = "Stagehost-Call-Status"

// statusSuffix ends the reply subject of a front's call status request:
// its answer comes on the call's own reply subject plus this, through
// the subscription that takes the call's answer, so that an answer the
// host sent before its status is read first.
const statusSuffix = ".s"

// statusRetry is how long a front waits before it asks again a host that
// did not answer a call status request (no responders: it is not
// connected yet).
const statusRetry = 100 * time.Millisecond

// ---- host side ----

// runningCalls tracks the call ids a host has acknowledged and not
// answered, and those it answered until their deadline (plus
// callClaimMargin) has passed.
type runningCalls struct {
	mu       sync.Mutex
	ids      map[string]int
	answered map[string]time.Time // until when it is kept
	adds     int
	// kept are the answers sent (with their reply subjects), oldest
	// first in keptOrder, keptBytes of them at most maxKeptBytes: one is
	// sent again when a front asks about its call (its first copy may
	// have been lost with a connection).
	kept      map[string]*nats.Msg
	keptOrder []string
	keptBytes int
	noKeep    bool // tests: keep no answer
}

// Answers a host keeps to send again: each at most maxKeptAnswer bytes,
// maxKeptBytes in all (the oldest dropped first), and only until its
// call's deadline plus callClaimMargin.
const (
	maxKeptAnswer = 64 << 10
	maxKeptBytes  = 8 << 20
)

// keep records the answer m of call id, sent.
func (r *runningCalls) keep(id string, m *nats.Msg) {
	n := len(m.Data) + len(m.Subject)
	if n > maxKeptAnswer || id == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noKeep {
		return
	}
	if r.kept == nil {
		r.kept = map[string]*nats.Msg{}
	}
	if _, ok := r.kept[id]; ok {
		return
	}
	r.kept[id] = m
	r.keptOrder = append(r.keptOrder, id)
	r.keptBytes += n
	for r.keptBytes > maxKeptBytes && len(r.keptOrder) > 0 {
		r.dropKept(r.keptOrder[0])
		r.keptOrder = r.keptOrder[1:]
	}
}

// dropKept forgets a kept answer (under r.mu; keptOrder is the caller's).
func (r *runningCalls) dropKept(id string) {
	if m, ok := r.kept[id]; ok {
		r.keptBytes -= len(m.Data) + len(m.Subject)
		delete(r.kept, id)
	}
}

// answer is the kept answer of call id, or nil.
func (r *runningCalls) answer(id string) *nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	if until, ok := r.answered[id]; !ok || time.Now().After(until) {
		return nil
	}
	return r.kept[id]
}

func (r *runningCalls) add(id string) {
	r.mu.Lock()
	if r.ids == nil {
		r.ids, r.answered = map[string]int{}, map[string]time.Time{}
	}
	r.ids[id]++
	r.mu.Unlock()
}

// done: the call's answer was sent (or it ended without one).
func (r *runningCalls) done(id string, deadline time.Time) {
	now := time.Now()
	if deadline.IsZero() {
		deadline = now.Add(claimTimeout)
	}
	r.mu.Lock()
	if r.ids[id]--; r.ids[id] <= 0 {
		delete(r.ids, id)
	}
	r.answered[id] = deadline.Add(callClaimMargin)
	if r.adds++; r.adds >= 1024 {
		r.adds = 0
		for k, until := range r.answered {
			if now.After(until) {
				delete(r.answered, k)
				r.dropKept(k)
			}
		}
		order := r.keptOrder[:0]
		for _, k := range r.keptOrder {
			if _, ok := r.kept[k]; ok {
				order = append(order, k)
			}
		}
		r.keptOrder = order
	}
	r.mu.Unlock()
}

// status is "running", "answered" or "unknown".
func (r *runningCalls) status(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids[id] > 0 {
		return "running"
	}
	if until, ok := r.answered[id]; ok && time.Now().Before(until) {
		return "answered"
	}
	return "unknown"
}

// startFailover subscribes the host's call status subject, and beats at
// once whenever its connection comes back, so that fronts learn of the
// reconnection (HostRecord.Reconnects) and ask about its calls.
func (h *Host) startFailover() error {
	sub, err := h.nc.Subscribe(CallStatusSubject(h.cfg.Lattice, h.cfg.ID), func(m *nats.Msg) {
		st := h.runningIDs.status(string(m.Data))
		if a := h.runningIDs.answer(string(m.Data)); st == "answered" && a != nil {
			// Sent again before the status, on the same connection: the
			// front reads it first.
			_ = h.nc.PublishMsg(a)
		}
		_ = m.RespondMsg(&nats.Msg{Header: nats.Header{CallStatusHeader: {st}, HostHeader: {h.cfg.ID}}})
	})
	if err != nil {
		return err
	}
	h.statusSub = sub
	// Asked by every host: only one that has the call answers.
	if h.whoSub, err = h.nc.Subscribe(CallWhoSubject(h.cfg.Lattice), func(m *nats.Msg) {
		if st := h.runningIDs.status(string(m.Data)); st != "unknown" {
			if a := h.runningIDs.answer(string(m.Data)); st == "answered" && a != nil {
				_ = h.nc.PublishMsg(a) // as for a call status request
			}
			_ = m.RespondMsg(&nats.Msg{Header: nats.Header{CallStatusHeader: {st}, HostHeader: {h.cfg.ID}}})
		}
	}); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	ch := h.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	go func() {
		for {
			select {
			case <-h.stop:
				return
			case st := <-ch:
				if st == nats.CLOSED {
					return
				}
				select {
				case h.kick <- struct{}{}:
				default:
				}
			}
		}
	}()
	return nil
}

// publishBeat sends the heartbeat over core NATS (BeatSubject).
func (h *Host) publishBeat(b []byte) {
	_ = h.nc.Publish(BeatSubject(h.cfg.Lattice, h.cfg.ID), b)
}

// ---- front side ----

// coreBeat takes a heartbeat published over core NATS: the host is live.
func (f *Front) coreBeat(m *nats.Msg) {
	var rec HostRecord
	if err := json.Unmarshal(m.Data, &rec); err != nil || rec.ID == "" {
		return
	}
	f.mu.Lock()
	if f.hasLeft(rec, time.Now()) {
		f.mu.Unlock() // a beat of a host that has left, overtaken by its delete
		return
	}
	reconnected := f.heard(rec)
	f.mu.Unlock()
	if reconnected {
		f.askHost(rec.ID)
	}
	f.changed.notify()
}

// heard records rec, from either source, if it is newer than what the
// front has: it says whether the host has reconnected to NATS since.
// Called under f.mu.
func (f *Front) heard(rec HostRecord) (reconnected bool) {
	old := f.hosts[rec.ID]
	if old != nil && old.rec.Started.Equal(rec.Started) && rec.Seq <= old.rec.Seq {
		return false // a beat already taken (from the other source), or one replayed
	}
	f.hosts[rec.ID] = &liveHost{rec: rec, seen: time.Now()}
	delete(f.left, rec.ID) // another process with the id (the callers skip the one that left)
	for _, sc := range rec.Sessions {
		f.known[sc.Name] = true
	}
	for _, rc := range rec.Residents {
		if f.knownResidents == nil {
			f.knownResidents = map[string]bool{}
		}
		f.knownResidents[rc.Name] = true
	}
	return old != nil && old.rec.Started.Equal(rec.Started) && rec.Reconnects > old.rec.Reconnects
}

// leftHost is a host whose heartbeat was deleted: its start time and
// when the front saw the delete.
type leftHost struct{ started, at time.Time }

// hasLeft says whether rec is a beat of a host that left, sent before it
// left: its process's (same start time), within a beat interval (TTL/3)
// of the delete. A process that goes on beating after that is live (its
// record was deleted by someone else). Called under f.mu.
func (f *Front) hasLeft(rec HostRecord, now time.Time) bool {
	l, ok := f.left[rec.ID]
	return ok && l.started.Equal(rec.Started) && now.Sub(l.at) < f.cfg.TTL/3
}

// fresh says whether the front heard from host id within the TTL.
// Called under f.mu.
func (f *Front) fresh(id string, now time.Time) bool {
	lh := f.hosts[id]
	return lh != nil && now.Sub(lh.seen) <= f.cfg.TTL
}

// followConn follows the front's connection: while it is down no host is
// counted gone (it cannot hear them), and once it is back the hosts
// holding calls whose answers may have been lost meanwhile are asked
// about them.
func (f *Front) followConn(ch chan nats.Status) {
	defer f.done.Done()
	for {
		select {
		case <-f.stop:
			return
		case st := <-ch:
			switch st {
			case nats.CONNECTED:
				f.mu.Lock()
				f.connectedAt, f.downSince = time.Now(), time.Time{}
				f.mu.Unlock()
				f.askHost("")
			case nats.DISCONNECTED, nats.RECONNECTING:
				f.mu.Lock()
				if f.downSince.IsZero() {
					f.downSince = time.Now()
				}
				f.mu.Unlock()
			case nats.CLOSED:
				return
			}
		}
	}
}

// disconnected refuses a call through the lattice while the front's
// connection has been down for longer than the TTL (a NATS outage, not a
// move to another node, which takes milliseconds): 503 at once rather
// than at the call's deadline. Shorter, the call is sent once the
// connection is back.
func (f *Front) disconnected() *Error {
	f.mu.Lock()
	since := f.downSince
	f.mu.Unlock()
	if since.IsZero() || time.Since(since) <= f.cfg.TTL || f.nc.Status() == nats.CONNECTED {
		return nil
	}
	return unavailable("", "this member has been disconnected from the NATS servers of lattice %s since %s (%v): no call can go through the lattice", f.cfg.Lattice,
		since.UTC().Format(time.RFC3339), time.Since(since).Round(time.Second))
}

// askHost asks host (every host, for "") about each call it acknowledged
// and has not answered: an answer sent while the front or the host was
// disconnected from NATS was lost. The host answers on the call's reply
// subject plus statusSuffix.
func (f *Front) askHost(host string) {
	f.mu.Lock()
	var ask []*call
	for _, c := range f.pending {
		if c.token != "" && c.host != "" && (host == "" || c.host == host) {
			ask = append(ask, c)
		}
	}
	f.mu.Unlock()
	for _, c := range ask {
		f.askCall(c)
	}
}

// askCall sends one call status request.
func (f *Front) askCall(c *call) {
	f.mu.Lock()
	host, gone := c.host, f.pending[c.token] != c
	f.mu.Unlock()
	if gone || host == "" || time.Now().After(c.deadline) {
		return
	}
	_ = f.nc.PublishMsg(&nats.Msg{Subject: CallStatusSubject(f.cfg.Lattice, host), Reply: f.inbox + "." + c.token + statusSuffix,
		Data: []byte(c.id)})
}

// callStatus takes a host's answer to a call status request (token is
// the call's), in order with the call's answers: a call its host is not
// running and that has had no answer lost its answer.
func (f *Front) callStatus(token string, m *nats.Msg) {
	f.mu.Lock()
	c := f.pending[token]
	f.mu.Unlock()
	if c == nil {
		return
	}
	switch m.Header.Get(CallStatusHeader) {
	case "unknown", "answered":
		f.mu.Lock()
		host := c.host
		if host == "" {
			c.host = m.Header.Get(HostHeader) // it had acknowledged it: the acknowledgement was lost
		}
		f.mu.Unlock()
		if host == "" || host == m.Header.Get(HostHeader) {
			c.loseOnce.Do(func() { close(c.lost) })
		}
	case "running":
		f.mu.Lock()
		if c.host == "" {
			c.host = m.Header.Get(HostHeader) // its acknowledgement was lost
		}
		f.mu.Unlock()
	default:
		if m.Header.Get("Status") == "503" { // no responders: the host is not (yet) connected
			time.AfterFunc(statusRetry, func() { f.askCall(c) })
		}
	}
}

// askWho asks every host whether it has call c (CallWhoSubject).
func (f *Front) askWho(c *call) {
	_ = f.nc.PublishMsg(&nats.Msg{Subject: CallWhoSubject(f.cfg.Lattice), Reply: f.inbox + "." + c.token + statusSuffix, Data: []byte(c.id)})
}

// statusToken is the call token of a call status answer's subject
// suffix, if it is one.
func statusToken(token string) (string, bool) { return strings.CutSuffix(token, statusSuffix) }

// noResponderRetry is how long a front waits before it sends again a
// session call that reached no host (no responders) while live hosts
// serve the session, at most maxNoResponderResends times within the
// deadline: after a node of the cluster is lost, the members that were
// on it are back on another within milliseconds, and the nodes' interest
// follows.
const (
	noResponderRetry      = 50 * time.Millisecond
	maxNoResponderResends = 20
)

// noResponders says whether m is the server's no-responders answer to a
// session call that live hosts serve, with time left to send it again.
func (f *Front) noResponders(m *nats.Msg, x exchange, left time.Duration) bool {
	if m.Header.Get("Status") != "503" || !x.claims || left <= 2*noResponderRetry {
		return false
	}
	return f.refuse(x.name) == nil
}

// claimRetry is the pause between two attempts at a call claim that
// failed for want of the calls bucket (its stream has no leader while a
// lost node is replaced), and claimAttempt bounds one attempt.
const (
	claimRetry   = 50 * time.Millisecond
	claimAttempt = 500 * time.Millisecond
)

// sleepCtx waits d or until ctx ends; false if ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
