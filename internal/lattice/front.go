package lattice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/tracing"
)

// FrontConfig configures a [Front].
type FrontConfig struct {
	// Lattice names the lattice.
	Lattice string
	// TTL is the lattice's heartbeat TTL (the hosts bucket's): a host not
	// heard from for longer is gone. Required: the [lattice] table's
	// heartbeat_ttl, as the hosts'.
	TTL time.Duration
	// Local, when set, is this process's host: a call runs on it when one
	// of the session's instances is free at once, and goes through the
	// lattice otherwise. The front then reads the host's view of the
	// shared quarantine instead of watching one of its own, so that the
	// process has one view: what its host has quarantined or seen
	// cleared, its front has too. Once the host has closed (the process
	// is leaving), that view stops following the bucket.
	Local *Host
	// DefaultDeadline bounds a call whose context has no deadline.
	// Default 30s.
	DefaultDeadline time.Duration
	// Grace is how long past a call's deadline the front waits for the
	// host's own deadline_exceeded answer. Default 250ms.
	Grace time.Duration
	// Replicas: as [HostConfig.Replicas], for the buckets the front opens
	// (it may be the first member to make them). Default 1.
	Replicas int
	// PayloadStoreMax: as [HostConfig.PayloadStoreMax].
	PayloadStoreMax int64
	// AckTimeout is how long the front waits for a host to acknowledge a
	// call it sent (a host acknowledges on receipt, before it runs the
	// call). A call no host acknowledged in that time reached none that
	// will run it (the host that got it died first), so the front sends
	// it again, until the deadline. Default 1s. Half of it is the
	// acknowledgement window (ClaimAfterHeader): a host that starts the
	// first copy of a call later than that claims its id first, as it
	// does every copy sent again (docs/lattice.md, "Delivery").
	AckTimeout time.Duration
	// Logger: default slog.Default().
	Logger *slog.Logger
	// TracerProvider records the front's client span of each call it
	// sends through the lattice (docs/lattice.md, "Tracing"). Default
	// nil: a no-op provider, with which a call carries its context's
	// traceparent to the host unchanged (or one the front makes).
	TracerProvider trace.TracerProvider
}

// FrontStats counts a front's calls.
type FrontStats struct {
	Local  uint64 `json:"local"`  // run on a free local instance
	Remote uint64 `json:"remote"` // sent through the lattice
	// Refused: no live host serves the session, or its module is
	// quarantined lattice-wide (503, sent nowhere).
	Refused uint64 `json:"refused"`
	// NoResponders: sent, but no host subscribed to the session (503).
	NoResponders uint64 `json:"no_responders"`
	// HostGone: in flight on a host whose heartbeat expired (503).
	HostGone uint64 `json:"host_gone"`
	// Unanswered: no host acked or answered before the deadline (503).
	Unanswered uint64 `json:"unanswered"`
	// Resent: calls sent again because no host acknowledged them within
	// AckTimeout.
	Resent uint64 `json:"resent"`
	// DroppedOutputs: outputs in the payload store that no call read
	// (the call had ended, or another host answered it first), deleted
	// when their answer reached the front.
	DroppedOutputs uint64 `json:"dropped_outputs"`
}

// Front routes session calls: to a free local instance, or through the
// lattice to the session's queue group. It watches the hosts bucket to
// know which live hosts serve which session, and refuses (503, class
// unavailable, with the reason) a call to a session no live host serves.
type Front struct {
	cfg      FrontConfig
	tracer   trace.Tracer
	nc       *nats.Conn
	q        *Quarantine
	payloads *payloads
	ownQ     bool // q is the front's own (no Local), closed with it
	js       jetstream.JetStream
	// models is the lattice's desired modules (the Local host's, with
	// one; else the front's own, closed with it under modelsMu).
	modelsMu  sync.Mutex
	models    *models
	ownModels bool
	w         jetstream.KeyWatcher
	inbox     string
	sub       *nats.Subscription
	idBase    string // the front's part of its call ids: random, new in each front

	mu      sync.Mutex
	hosts   map[string]*liveHost
	known   map[string]bool // every session a heartbeat named since the front started
	pending map[string]*call
	next    uint64
	changed notifier

	// knownResidents (under mu): every resident session a heartbeat named
	// since the front started; made at the first.
	knownResidents map[string]bool
	// left (under mu): each host that left (its heartbeat deleted), so
	// that a core beat overtaken by the delete does not bring it back
	// (hasLeft); connectedAt: when the connection last
	// came up (failover.go).
	left        map[string]leftHost
	connectedAt time.Time
	// downSince: when the connection went down (zero while it is up).
	downSince time.Time
	beatSub   *nats.Subscription

	stats struct{ local, remote, refused, noResp, gone, unanswered, resent, dropped atomic.Uint64 }
	stop  chan struct{}
	done  sync.WaitGroup
}

type liveHost struct {
	rec  HostRecord
	seen time.Time // when the front last heard its heartbeat
}

// call is one request in flight through the lattice.
type call struct {
	ch     chan *nats.Msg // the ack and the answer
	host   string         // who acked, "" before
	gone   chan struct{}  // closed when that host's heartbeat expires
	closed bool
	span   trace.Span // the call's client span
	// token, id and deadline: the call's, for a call status request
	// (failover.go; session calls only). lost is closed when its host
	// says it is not running a call it acknowledged, whose answer has
	// not come: the answer was lost with a connection.
	token, id string
	deadline  time.Time
	lost      chan struct{}
	loseOnce  sync.Once
}

// NewFront starts a front over nc: it loads the live hosts before it
// returns.
func NewFront(ctx context.Context, nc *nats.Conn, cfg FrontConfig) (*Front, error) {
	if cfg.TTL <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "lattice %s: the front's TTL must be set (the [lattice] table's heartbeat_ttl)", cfg.Lattice)
	}
	if cfg.DefaultDeadline <= 0 {
		cfg.DefaultDeadline = 30 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 250 * time.Millisecond
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkName("lattice", cfg.Lattice); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := openHosts(ctx, js, cfg.Lattice, cfg.TTL, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	f := &Front{cfg: cfg, js: js, tracer: tracing.Tracer(cfg.TracerProvider), nc: nc, inbox: nc.NewInbox(), idBase: nuid.Next(), hosts: map[string]*liveHost{}, known: map[string]bool{},
		pending: map[string]*call{}, stop: make(chan struct{}), left: map[string]leftHost{}, connectedAt: time.Now()}
	if f.payloads, err = openPayloads(ctx, nc, js, cfg.Lattice, cfg.Replicas, cfg.PayloadStoreMax); err != nil {
		return nil, err
	}
	if cfg.Local != nil {
		f.models = cfg.Local.models
	} else if f.models, err = openModels(ctx, js, cfg.Lattice, cfg.Replicas); err != nil {
		return nil, err
	} else {
		f.ownModels = true
	}
	if cfg.Local != nil {
		f.q = cfg.Local.q
	} else {
		if f.q, err = OpenQuarantine(ctx, js, cfg.Lattice, cfg.Replicas); err != nil {
			return nil, err
		}
		f.ownQ = true
	}
	if f.sub, err = nc.Subscribe(f.inbox+".>", f.answer); err != nil {
		f.closeQ()
		return nil, err
	}
	if f.beatSub, err = nc.Subscribe(BeatSubject(cfg.Lattice, "*"), f.coreBeat); err != nil { // failover.go
		_ = f.sub.Unsubscribe()
		f.closeQ()
		return nil, err
	}
	if f.w, err = kv.WatchAll(context.WithoutCancel(ctx)); err != nil {
		_ = f.beatSub.Unsubscribe()
		_ = f.sub.Unsubscribe()
		f.closeQ()
		return nil, err
	}
	loaded := make(chan struct{})
	f.done.Add(3)
	go f.watch(loaded)
	go f.expire()
	go f.followConn(nc.StatusChanged(nats.CONNECTED, nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED))
	select {
	case <-loaded:
		return f, nil
	case <-ctx.Done():
		f.Close()
		return nil, ctx.Err()
	}
}

// watch follows the hosts bucket: a put is a heartbeat, a delete (a host
// that left) or a limit marker (an expired heartbeat) a host gone.
func (f *Front) watch(loaded chan struct{}) {
	defer f.done.Done()
	for e := range f.w.Updates() {
		if e == nil {
			close(loaded)
			continue
		}
		id := e.Key()
		if e.Operation() == jetstream.KeyValuePut {
			var rec HostRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				f.cfg.Logger.Warn("lattice: bad heartbeat", "host", id, "err", err)
				continue
			}
			f.mu.Lock()
			if !f.hasLeft(rec, time.Now()) {
				f.heard(rec) // failover.go: unless its core beat came first
			}
			f.mu.Unlock()
		} else {
			// A delete is a host leaving (Host.Close): its calls in flight
			// still get their answers. A purge or limit marker is an
			// expired heartbeat: the host is gone, and its calls with it,
			// unless the front heard its core beat within the TTL (the
			// bucket's stream expires what it kept when it comes back
			// after a lost leader was replaced, while the host lived on).
			f.mu.Lock()
			if e.Operation() == jetstream.KeyValueDelete {
				if lh := f.hosts[id]; lh != nil {
					f.left[id] = leftHost{lh.rec.Started, time.Now()}
				}
				f.dropHost(id, false)
			} else if !f.fresh(id, time.Now()) {
				f.dropHost(id, true)
			}
			f.mu.Unlock()
		}
		f.changed.notify()
	}
}

// expire drops the hosts not heard from within the TTL, whether or not
// the bucket's limit marker has come yet.
func (f *Front) expire() {
	defer f.done.Done()
	t := time.NewTicker(max(f.cfg.TTL/20, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			if f.nc.Status() != nats.CONNECTED {
				// The front hears no host now: none is counted gone
				// before it has been connected for a TTL again.
				continue
			}
			f.mu.Lock()
			n := 0
			for id, lh := range f.hosts {
				if now.Sub(lh.seen) > f.cfg.TTL && now.Sub(f.connectedAt) > f.cfg.TTL {
					f.dropHost(id, true)
					n++
				}
			}
			f.mu.Unlock()
			if n > 0 {
				f.changed.notify()
			}
		}
	}
}

// dropHost forgets a host and, when it is gone (not leaving), fails its
// calls in flight. Called under f.mu.
func (f *Front) dropHost(id string, gone bool) {
	if _, ok := f.hosts[id]; !ok {
		return
	}
	delete(f.hosts, id)
	if !gone {
		return
	}
	for _, c := range f.pending {
		if c.host == id && !c.closed {
			close(c.gone)
			c.closed = true
		}
	}
}

// answer receives the acks and answers of the calls in flight.
func (f *Front) answer(m *nats.Msg) {
	token := m.Subject[len(f.inbox)+1:]
	if t, ok := statusToken(token); ok {
		f.callStatus(t, m) // failover.go
		return
	}
	f.mu.Lock()
	c := f.pending[token]
	if c != nil && m.Header.Get(AckHeader) != "" {
		if c.host != "" {
			// A later copy's: the first host to acknowledge holds it
			// (a host that claims a copy sent again acknowledges only
			// what it claimed).
			f.mu.Unlock()
			return
		}
		c.host = m.Header.Get(HostHeader)
		f.mu.Unlock()
		if c.span.IsRecording() {
			c.span.AddEvent("acknowledged", trace.WithAttributes(tracing.HostKey.String(c.host)))
		}
		return
	}
	taken := false
	if c != nil {
		// Under f.mu: roundTrip, which removes c from pending under it,
		// then finds every answer that reached c's channel.
		select {
		case c.ch <- m:
			taken = true
		default:
		}
	}
	f.mu.Unlock()
	if !taken {
		// Nobody will read this answer: its call ended (the client went
		// away, the deadline and Grace passed, the host went away) or
		// another host answered it first. Its output object is deleted
		// now, not left to the TTL.
		f.dropAnswer(m)
	}
}

// dropAnswer deletes the payload store object of an answer that no call
// reads (in the background: answer runs on the inbox's subscription).
func (f *Front) dropAnswer(m *nats.Msg) {
	name := m.Header.Get(PayloadHeader)
	if name == "" || m.Header.Get(AckHeader) != "" {
		return
	}
	f.cfg.Logger.Debug("lattice: deleting the output of an answer no call reads", "object", name, "host", m.Header.Get(HostHeader))
	go func() {
		f.payloads.remove(name)
		f.stats.dropped.Add(1)
	}()
}

// Hosts lists the live hosts' latest heartbeats, sorted by id.
func (f *Front) Hosts() []HostRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sortedHosts(f.hosts)
}

// Serving lists the live hosts that serve a session.
func (f *Front) Serving(session string) []string {
	var ids []string
	for _, rec := range f.Hosts() {
		for _, sc := range rec.Sessions {
			if sc.Name == session && sc.Serving {
				ids = append(ids, rec.ID)
			}
		}
	}
	return ids
}

// Known reports whether a heartbeat named the session since the front
// started (a live host has it, or had it).
func (f *Front) Known(session string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.known[session]
}

// Stats counts the front's calls.
func (f *Front) Stats() FrontStats {
	return FrontStats{Local: f.stats.local.Load(), Remote: f.stats.remote.Load(), Refused: f.stats.refused.Load(),
		NoResponders: f.stats.noResp.Load(), HostGone: f.stats.gone.Load(), Unanswered: f.stats.unanswered.Load(), Resent: f.stats.resent.Load(),
		DroppedOutputs: f.stats.dropped.Load()}
}

// Quarantine is the lattice's shared quarantine, as the front sees it.
func (f *Front) Quarantine() *Quarantine { return f.q }

// WaitFor waits until cond holds, checking it at every change in the
// front's view of the hosts (a heartbeat, a host gone), or until ctx
// ends.
func (f *Front) WaitFor(ctx context.Context, cond func() bool) error {
	return f.changed.waitFor(ctx, cond)
}

// Call runs a call to a session: on a free local instance (Local), or
// through the lattice to a host that serves the session, with ctx's
// deadline (or DefaultDeadline) and trace context: the front's client
// span's with a TracerProvider, else ctx's span context (see
// [WithTraceparent]) unchanged, else a new one.
//
// # Errors
//
// The local session's errors, or an [*Error] with the service's class:
// the answering host's error; unavailable (503) when no live host serves
// the session, its module is quarantined lattice-wide, no host responds,
// or the host that took the call went away; deadline_exceeded when the
// host did not answer within the deadline.
func (f *Front) Call(ctx context.Context, session string, input []byte) ([]byte, error) {
	out, _, err := f.call(ctx, session, input)
	return out, err
}

// call is Call, and returns the traceparent the call was sent with: ""
// when it was sent to no host (it ran locally, or was refused).
func (f *Front) call(ctx context.Context, session string, input []byte) ([]byte, string, error) {
	if f.cfg.Local != nil {
		if out, err, ok := f.cfg.Local.tryCall(ctx, session, input); ok {
			f.stats.local.Add(1)
			return out, "", err
		}
	}
	if f.cfg.Local != nil && f.nc.Status() != nats.CONNECTED {
		// No call can go through the lattice now: wait for a local
		// instance instead, within the call's deadline.
		ctx, cancel := f.withDeadline(ctx)
		defer cancel()
		if out, err, ok := f.cfg.Local.waitCall(ctx, session, input); ok {
			f.stats.local.Add(1)
			return out, "", err
		}
	}
	if err := f.refuse(session); err != nil {
		f.stats.refused.Add(1)
		return nil, "", err
	}
	if err := f.disconnected(); err != nil { // failover.go
		f.stats.refused.Add(1)
		return nil, "", err
	}
	f.stats.remote.Add(1)
	return f.remote(ctx, session, input)
}

// withDeadline is ctx with the call's deadline: ctx's, or
// DefaultDeadline from now.
func (f *Front) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, f.cfg.DefaultDeadline)
}

// refuse returns why the front will not send a call to session, or nil.
func (f *Front) refuse(session string) *Error {
	// Every call sent through the lattice asks this: the live hosts
	// are read in place, unsorted and uncopied.
	var known []string
	var poisoned *Poison
	poisonedOn := ""
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, lh := range f.hosts {
		for _, sc := range lh.rec.Sessions {
			if sc.Name != session {
				continue
			}
			// The front's view of the quarantine first: a heartbeat
			// written before the poison still says serving, while the
			// host has stopped taking the session's calls.
			if p, ok := f.q.Lookup(sc.StageSHA256); ok {
				if poisoned == nil || id < poisonedOn {
					poisoned, poisonedOn = &p, id
				}
				continue
			}
			if sc.Serving {
				return nil
			}
			known = append(known, fmt.Sprintf("host %s has it %s: %s", id, sc.State, sc.Reason))
		}
	}
	switch {
	case poisoned != nil:
		return refusal("", *poisoned)
	case len(known) > 0:
		sort.Strings(known)
		return unavailable("", "session %q is served by no live host of lattice %s (%s)", session, f.cfg.Lattice, strings.Join(known, "; "))
	}
	return unavailable("", "session %q is served by no live host of lattice %s", session, f.cfg.Lattice)
}

// remote sends a call through the lattice, under the front's client
// span, and returns the traceparent it sent.
func (f *Front) remote(ctx context.Context, session string, input []byte) (out []byte, tp string, err error) {
	rid := requestid.FromContext(ctx)
	ctx, span := f.startCall(ctx, session, rid)
	c := &call{ch: make(chan *nats.Msg, 1), gone: make(chan struct{}), span: span}
	resends := 0
	defer func() { endCall(span, f.ackedBy(c), resends, err) }()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(f.cfg.DefaultDeadline)
	}
	if time.Until(deadline) <= 0 {
		return nil, "", &Error{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: the deadline passed before the call was sent", session)}
	}
	var inputObject string
	if !f.payloads.fits(len(input)) {
		if inputObject, err = f.storeInput(ctx, session, deadline, input); err != nil {
			return nil, "", err
		}
		// Deleted once the call ended, however it ended: a call sent
		// again to another host reads the object again.
		defer f.payloads.remove(inputObject)
		input = nil
	}
	remaining := time.Until(deadline)
	if remaining <= 0 {
		return nil, "", &Error{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: the deadline passed while its input was stored", session)}
	}
	msg := &nats.Msg{Subject: SessionSubject(f.cfg.Lattice, session), Data: input, Header: nats.Header{}}
	tp = injectCall(ctx, msg.Header)
	if rev := f.models.committed(session); rev > 0 {
		msg.Header.Set(ModelRevisionHeader, strconv.FormatUint(rev, 10))
	}
	if rid != "" {
		msg.Header.Set(RequestIDHeader, rid)
	}
	if inputObject != "" {
		msg.Header.Set(PayloadHeader, inputObject)
	}
	m, err := f.roundTrip(ctx, c, msg, deadline, exchange{kind: "session", name: session, noun: "call", resend: true, resends: &resends, counted: true, claims: true})
	if err != nil {
		return nil, tp, err
	}
	out, err = f.decode(session, m, deadline)
	return out, tp, err
}

// exchange describes one request for roundTrip.
type exchange struct {
	// kind and name say whose request it is ("session", "s"): the
	// start of its errors (what), formatted only for one.
	kind, name string
	noun       string // what it is: "call", "start", "status request"
	// resend: a request no host acknowledged within AckTimeout is sent
	// again (it is idempotent, or no host began it).
	resend  bool
	resends *int // counts the resends, when set
	// counted: the request counts in Front.Stats (session calls; not
	// resident requests).
	counted bool
	// deadlineNote is added to a deadline_exceeded error of a request
	// a host acknowledged (" (the run may have started)").
	deadlineNote string
	// claims: the request carries ClaimAfterHeader (session calls): a
	// host claims its id before it starts a copy sent again, or one
	// older than half of AckTimeout.
	claims bool
}

// what is the start of the request's errors: `session "s"`.
func (x exchange) what() string { return fmt.Sprintf("%s %q", x.kind, x.name) }

// roundTrip sends msg (a session call or a resident request) through
// the lattice with an acknowledgement asked for and the deadline's
// remainder, and waits for the answer: until deadline plus Grace, the
// acknowledging host's heartbeat expiring ("went away"), or ctx being
// canceled. With x.resend, a request no host acknowledged within
// AckTimeout is sent again. The answer is not decoded.
func (f *Front) roundTrip(ctx context.Context, c *call, msg *nats.Msg, deadline time.Time, x exchange) (*nats.Msg, error) {
	remaining := time.Until(deadline)
	f.mu.Lock()
	f.next++
	token := strconv.FormatUint(f.next, 36)
	f.pending[token] = c
	if x.claims {
		c.token, c.id, c.deadline, c.lost = token, f.idBase+"-"+token, deadline, make(chan struct{})
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.pending, token)
		// An answer that arrived as the call ended another way (ctx,
		// the host gone) is not read: its output object is deleted.
		var unread []*nats.Msg
		for more := true; more; {
			select {
			case m := <-c.ch:
				unread = append(unread, m)
			default:
				more = false
			}
		}
		f.mu.Unlock()
		for _, m := range unread {
			f.dropAnswer(m)
		}
	}()
	msg.Reply = f.inbox + "." + token
	msg.Header.Set(DeadlineAtHeader, unixNanoHeader(deadline))
	msg.Header.Set(CallIDHeader, f.idBase+"-"+token)
	msg.Header.Set(AckHeader, "1")
	sent := time.Now()
	if x.claims {
		msg.Header.Set(ClaimAfterHeader, unixNanoHeader(sent.Add(f.cfg.AckTimeout/2)))
	}
	if err := f.nc.PublishMsg(msg); err != nil {
		return nil, unavailable("", "%s: sending the %s: %v", x.what(), x.noun, err)
	}
	timer := time.NewTimer(remaining + f.cfg.Grace)
	defer timer.Stop()
	ack := time.NewTimer(f.cfg.AckTimeout)
	defer ack.Stop()
	ctxDone := ctx.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	noResp := 0
	notRun := 0
	asked := false
	waitedLate := false
	for {
		select {
		case m := <-c.ch:
			left := time.Until(deadline)
			if f.noResponders(m, x, left) && noResp < maxNoResponderResends {
				// Nobody got this copy, while live hosts serve the
				// session: the server's interest had not caught up with
				// a member that reconnected to another node of the
				// cluster (failover.go). Sent again, shortly.
				noResp++
				retry.Reset(noResponderRetry)
				continue
			}
			if !x.resend || m.Header.Get(NotRunHeader) == "" || notRun >= MaxNotRunResends || left <= 0 {
				return m, nil
			}
			// The host that took it ran it nowhere (every instance there
			// went out of service while it waited) and left the
			// session's queue group: send it again, to another host.
			notRun++
			f.mu.Lock()
			c.host = ""
			f.mu.Unlock()
			if x.claims {
				msg.Header.Set(ClaimAfterHeader, "0") // a copy sent again is always claimed
			}
			sent = time.Now()
			if err := f.nc.PublishMsg(msg); err != nil {
				return m, nil
			}
			if x.counted {
				f.stats.resent.Add(1)
			}
			if x.resends != nil {
				*x.resends++
			}
			if c.span.IsRecording() {
				c.span.AddEvent("sent again: the host ran it nowhere", trace.WithAttributes(tracing.HostKey.String(m.Header.Get(HostHeader))))
			}
			f.cfg.Logger.Info("lattice request sent again: the host ran it nowhere", "what", x.what(), "host", m.Header.Get(HostHeader), "traceparent", msg.Header.Get(TraceparentHeader))
			ack.Reset(f.cfg.AckTimeout)
		case <-retry.C:
			sent = time.Now()
			if x.claims && msg.Header.Get(ClaimAfterHeader) != "0" {
				// No host got the copies before: this is the first that
				// may run, with its own acknowledgement window.
				msg.Header.Set(ClaimAfterHeader, unixNanoHeader(sent.Add(f.cfg.AckTimeout/2)))
			}
			if err := f.nc.PublishMsg(msg); err != nil {
				return nil, unavailable("", "%s: sending the %s: %v", x.what(), x.noun, err)
			}
			ack.Reset(f.cfg.AckTimeout)
		case <-ack.C:
			left := time.Until(deadline)
			if !x.resend || f.ackedBy(c) != "" || left <= 0 {
				continue
			}
			if late := time.Since(sent) - f.cfg.AckTimeout; !asked && late > f.cfg.AckTimeout/4 && !waitedLate {
				// The timer fired late: this process was stopped or
				// starved, and an acknowledgement may be waiting to be
				// read. Read it first.
				waitedLate = true
				ack.Reset(f.cfg.AckTimeout / 4)
				continue
			}
			waitedLate = false
			if x.claims && !asked {
				// Before it is sent again: a host that acknowledged it,
				// whose acknowledgement was lost with a connection, says
				// so (failover.go).
				asked = true
				f.askWho(c)
				ack.Reset(max(f.cfg.AckTimeout/4, minWhoWindow))
				continue
			}
			asked = false
			// No host took it: the one the server gave it to died before
			// it could, so another may. (At least once for such calls: a
			// host whose acknowledgement was lost with its connection
			// may have run it too.)
			if x.claims {
				msg.Header.Set(ClaimAfterHeader, "0") // a copy sent again is always claimed
			}
			sent = time.Now()
			if err := f.nc.PublishMsg(msg); err == nil {
				if x.counted {
					f.stats.resent.Add(1)
				}
				if x.resends != nil {
					*x.resends++
				}
				if c.span.IsRecording() {
					c.span.AddEvent("sent again: no host acknowledged it", trace.WithAttributes(attribute.String("stagehost.deadline_left", left.String())))
				}
				f.cfg.Logger.Info("lattice request sent again: no host acknowledged it", "what", x.what(), "request", x.noun, "traceparent", msg.Header.Get(TraceparentHeader), "after", f.cfg.AckTimeout)
			}
			ack.Reset(f.cfg.AckTimeout)
		case <-c.lost:
			select {
			case m := <-c.ch: // the answer came after all
				return m, nil
			default:
			}
			host := f.ackedBy(c)
			f.cfg.Logger.Info("lattice answer lost with a NATS connection", "what", x.what(), "host", host, "traceparent", msg.Header.Get(TraceparentHeader))
			return nil, &Error{Class: errdefs.ClassDeadlineExceeded, Host: host,
				Message: fmt.Sprintf("%s: %s%s", x.what(), AnswerLostMessage, host)}
		case <-c.gone:
			host := f.ackedBy(c)
			if x.counted {
				f.stats.gone.Add(1)
			}
			f.cfg.Logger.Info("lattice request lost with its host", "what", x.what(), "request", x.noun, "host", host, "traceparent", msg.Header.Get(TraceparentHeader))
			return nil, unavailable(host, "%s: host %s went away with the %s in flight%s", x.what(), host, x.noun, x.deadlineNote)
		case <-timer.C:
			if host := f.ackedBy(c); host != "" {
				return nil, &Error{Class: errdefs.ClassDeadlineExceeded, Host: host,
					Message: fmt.Sprintf("%s: host %s did not answer within the deadline of %v%s", x.what(), host, remaining.Round(time.Millisecond), x.deadlineNote)}
			}
			if x.counted {
				f.stats.unanswered.Add(1)
			}
			return nil, unavailable("", "%s: no host took the %s within the deadline of %v", x.what(), x.noun, remaining.Round(time.Millisecond))
		case <-ctxDone:
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The host has the deadline too: wait (Grace) for its answer.
				ctxDone = nil
				continue
			}
			return nil, &Error{Class: errdefs.ClassClientClosed, Message: fmt.Sprintf("%s: %v", x.what(), ctx.Err())}
		}
	}
}

// ackedBy names the host that acked c ("" if none).
func (f *Front) ackedBy(c *call) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return c.host
}

func (f *Front) decode(session string, m *nats.Msg, deadline time.Time) ([]byte, error) {
	if m.Header.Get("Status") == "503" { // the server's no-responders answer
		f.stats.noResp.Add(1)
		if err := f.refuse(session); err != nil {
			// Why, by the heartbeats since: the hosts stopped taking
			// the session's calls (quarantined, out of service, gone).
			return nil, err
		}
		return nil, unavailable("", "session %q: no host of lattice %s responds (no responders)", session, f.cfg.Lattice)
	}
	out, err := decodeAnswer(m)
	if name := m.Header.Get(PayloadHeader); err == nil && name != "" {
		return f.readOutput(session, m.Header.Get(HostHeader), name, deadline)
	}
	return out, err
}

// storeInput puts a call's input that one message cannot carry in the
// payload store, within the call's deadline, and returns the object's
// name for the request.
func (f *Front) storeInput(ctx context.Context, session string, deadline time.Time, input []byte) (string, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	name, err := f.payloads.put(ctx, input)
	if err == nil {
		return name, nil
	}
	var over *overStoreLimit
	switch {
	case errors.As(err, &over):
		return "", &Error{Class: errdefs.ClassOutOfBudget, Message: fmt.Sprintf("session %q: the input of %d bytes is larger than the lattice's payload store holds (payload_store_max %d bytes)", session, len(input), over.limit)}
	case errors.Is(ctx.Err(), context.Canceled):
		return "", &Error{Class: errdefs.ClassClientClosed, Message: fmt.Sprintf("session %q: %v", session, ctx.Err())}
	case ctx.Err() != nil:
		return "", &Error{Class: errdefs.ClassDeadlineExceeded, Message: fmt.Sprintf("session %q: the deadline passed while its input of %d bytes was stored in the lattice's payload store", session, len(input))}
	}
	return "", unavailable("", "session %q: storing an input of %d bytes in the lattice's payload store: %v", session, len(input), err)
}

// readOutput reads a call's output that its host put in the payload
// store, then deletes it.
func (f *Front) readOutput(session, host, name string, deadline time.Time) ([]byte, error) {
	defer f.payloads.remove(name)
	// As long as the front waits for an answer: the deadline plus Grace.
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(f.cfg.Grace))
	defer cancel()
	out, err := f.payloads.get(ctx, name, maxPayloadObject)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &Error{Class: errdefs.ClassDeadlineExceeded, Host: host,
				Message: fmt.Sprintf("session %q: the deadline passed while the output (object %s) was read from the lattice's payload store", session, name)}
		}
		return nil, unavailable(host, "session %q: reading the output (object %s) from the lattice's payload store: %v", session, name, err)
	}
	return out, nil
}

// decodeAnswer is a host's answer: its data, or its error answer as an
// [*Error] (from the JSON body, else from the headers).
func decodeAnswer(m *nats.Msg) ([]byte, error) {
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		e := &Error{}
		if json.Unmarshal(m.Data, e) != nil || e.Class == "" {
			e = &Error{Class: m.Header.Get(ClassHeader), Message: m.Header.Get(micro.ErrorHeader), Host: m.Header.Get(HostHeader)}
			if e.Class == "" {
				e.Class = errdefs.ClassInternal
			}
		}
		return nil, e
	}
	return m.Data, nil
}

// Close stops the front. Calls in flight end at their deadlines.
func (f *Front) Close() {
	select {
	case <-f.stop:
		return
	default:
	}
	close(f.stop)
	if f.w != nil {
		_ = f.w.Stop()
	}
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
	}
	if f.beatSub != nil {
		_ = f.beatSub.Unsubscribe()
	}
	f.done.Wait()
	f.closeQ()
	f.modelsMu.Lock()
	if f.ownModels {
		_ = f.models.close()
		f.ownModels = false
	}
	f.modelsMu.Unlock()
}

// closeQ closes the front's view of the quarantine if it is its own.
func (f *Front) closeQ() {
	if f.ownQ {
		_ = f.q.Close()
	}
}
