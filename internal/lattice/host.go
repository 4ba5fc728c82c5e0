package lattice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/requestid"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/stages"
)

// HostConfig configures a [Host].
type HostConfig struct {
	// Lattice names the lattice (subjects and buckets); ID the host, unique
	// in it. Both: letters, digits, '-' or '_'.
	Lattice, ID string
	// TTL is the heartbeat bucket's TTL: a host whose heartbeat is older
	// is gone. The host heartbeats every TTL/3. Every member of a lattice
	// must use one TTL (it is the bucket's). Required: the caller passes
	// its [lattice] table's heartbeat_ttl (manifest.DefaultHeartbeatTTL
	// when the table has none), so that the defaults live in one place.
	TTL time.Duration
	// FenceFailures is how many instances of a module's sessions on this
	// host may be quarantined (their fence failed: the device could not be
	// proven idle) before the host puts the module in the lattice's shared
	// quarantine. 0 or negative: never (the caller passes its [lattice]
	// table's fence_failures, manifest.DefaultFenceFailures when the
	// table has none). A module whose call made a
	// device lost is quarantined at once, unless NoDeviceLostQuarantine.
	FenceFailures int
	// NoDeviceLostQuarantine: a call that made a device lost does not put
	// its module in the shared quarantine.
	NoDeviceLostQuarantine bool
	// ClaimTTL is the placement bucket's TTL: how long a claim of a
	// session with placement "exclusive" lasts without a renewal. The
	// holder renews it with each heartbeat and serves only while its
	// last renewal is younger than ClaimTTL/2, so ClaimTTL must be at
	// least 2 × TTL. It bounds how long an exclusive session whose holder
	// died is served by no host. Required, like TTL (the [lattice]
	// table's claim_ttl); one value for the whole lattice.
	ClaimTTL time.Duration
	// Replicas is how many NATS servers keep each of the lattice's KV
	// buckets (1 to 5, at most the JetStream cluster's size): with 3, a
	// bucket survives the loss of one server. Default 1. One value for
	// the whole lattice: the first member to make a bucket sets it.
	Replicas int
	// PayloadStoreMax bounds the bytes the lattice's payload store holds
	// (its stream's MaxBytes; the [lattice] table's payload_store_max).
	// A payload larger than it is refused out_of_budget before it is
	// stored; one that does not fit beside the objects already there is
	// refused unavailable (docs/lattice.md, "Large payloads"). One value
	// for the whole lattice: each member sets it as it joins, the last
	// one's holds. 0 or negative: no limit.
	PayloadStoreMax int64
	// Readiness reports the host's readiness for its heartbeat (the HTTP
	// service passes its Server.Readiness). Default: from the deployment's
	// devices and sessions, as Server.Readiness with
	// ready_quarantined_share 0.
	Readiness func() deploy.Readiness
	// Logger receives one debug line per call (with its traceparent) and
	// the host's warnings. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider records the host's server span of each call it
	// takes from the lattice, a child of the span context the call
	// carries (docs/lattice.md, "Tracing"). Default nil: a no-op
	// provider.
	TracerProvider trace.TracerProvider
}

func (c *HostConfig) defaults() {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// HostRecord is a host's heartbeat: the value of its key (its id) in the
// lattice's hosts bucket, rewritten every TTL/3.
type HostRecord struct {
	Lattice   string            `json:"lattice"`
	ID        string            `json:"id"`
	Seq       uint64            `json:"seq"` // counts the host's heartbeats
	At        time.Time         `json:"at"`
	Started   time.Time         `json:"started"`
	TTL       time.Duration     `json:"ttl_ns"`
	Readiness deploy.Readiness  `json:"readiness"`
	Devices   []DeviceHealth    `json:"devices"`
	Sessions  []SessionCapacity `json:"sessions"`
	// Residents lists the host's resident sessions (resident.go); a
	// front sends their start and status requests to these hosts.
	Residents []ResidentCapacity `json:"residents"`
	// Quarantines lists the host's own quarantined or failed instances.
	Quarantines []InstanceQuarantine `json:"quarantines,omitempty"`
	// Calls counts the session calls the host took from the lattice
	// ([Host.Stats]).
	Calls HostStats `json:"calls"`
	// Reconnects counts the host's reconnections to NATS: a front that
	// sees it grow asks the host about the calls it holds there, whose
	// answers may have been lost with the connection (failover.go).
	Reconnects uint64 `json:"reconnects"`
}

// DeviceHealth is one device of a heartbeat.
type DeviceHealth struct {
	Name    string `json:"name"`
	Healthy bool   `json:"healthy"`
	Error   string `json:"error,omitempty"`
}

// SessionCapacity is one session of a heartbeat.
type SessionCapacity struct {
	Name string `json:"name"`
	// StageSHA256 is the sha256 of the stage module the session's
	// instances run now (after a swap, the new one's; not necessarily
	// the manifest's).
	StageSHA256 string `json:"stage_sha256"`
	// Module names that module (its [[module]] name, or the name it
	// was loaded under).
	Module string `json:"module,omitempty"`
	State  string `json:"state"` // deploy's session state; "refused" while its module is quarantined lattice-wide, or a lattice-wide swap was committed without this host
	Reason string `json:"reason,omitempty"`
	// Serving: the host takes calls to the session (its endpoint is
	// registered and the session is neither failed, fully out of
	// service, nor refused).
	Serving bool `json:"serving"`
	// Placement is "exclusive" for a session served by one host at a
	// time (the others have it "standby"); "" for the others.
	Placement string `json:"placement,omitempty"`
	Instances int    `json:"instances"`
	Out       int    `json:"instances_out"`
	InFlight  int    `json:"in_flight"` // calls through the lattice or a front on this host
	Free      int    `json:"free"`      // instances - out - in flight, at least 0
	Waiting   int    `json:"waiting"`
	// Outcomes counts the session's calls on this host since it started,
	// by outcome ("ok" or an error class), as its /v1/sessions does.
	Outcomes map[string]uint64 `json:"outcomes,omitempty"`
	// ModelRevision is the revision of the lattice's desired module for
	// the session (the models bucket's) that the host has applied: its
	// instances run it and the calls on the old ones have ended. 0: none
	// applied. A lattice-wide swap answers once every live host that has
	// the session acknowledged its revision here.
	ModelRevision uint64 `json:"model_revision,omitempty"`
	// ModelFailed is a newer revision whose apply failed, and ModelError
	// why: the host serves its module meanwhile, and tries again.
	ModelFailed uint64 `json:"model_failed,omitempty"`
	ModelError  string `json:"model_error,omitempty"`
	// HostOnly: the session runs a module swapped on this host only
	// (Host.Swap), until the lattice's next swap of it.
	HostOnly bool `json:"host_only,omitempty"`
}

// InstanceQuarantine is one instance out of service.
type InstanceQuarantine struct {
	Session  string `json:"session"`
	Instance int    `json:"instance"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
}

// Host serves a deployment's sessions to a lattice: each session is a NATS
// micro endpoint on SessionSubject in the session's queue group, so calls
// spread over the hosts that serve it, and each resident session a start
// and a status endpoint in the resident's queue group (resident.go). It
// heartbeats to the hosts bucket, refuses sessions whose module is in the
// shared quarantine, and puts modules in it (a device lost by a call;
// FenceFailures quarantined instances).
type Host struct {
	cfg      HostConfig
	tracer   trace.Tracer // cfg.TracerProvider's, looked up once
	traced   bool         // cfg.TracerProvider records spans (tracing.Records)
	nc       *nats.Conn
	d        *deploy.Deployment
	hosts    jetstream.KeyValue
	q        *Quarantine
	payloads *payloads
	// outputKeep is how long after its answer the host deletes an output
	// it put in the payload store ([OutputKeep]; shorter in tests).
	outputKeep atomic.Int64 // nanoseconds
	// beforeAnswer, when set (tests), runs after a call's output was
	// stored and before its answer is sent.
	beforeAnswer atomic.Pointer[func()]
	claims       *Claims
	callIDs      *callClaims // the calls bucket: claims of call ids (calls.go)
	models       *models     // the lattice's desired modules (models.go)
	modelsDone   chan struct{}
	swapMu       sync.Mutex // one swap at a time: the lattice's (applyDesired) or this host's (Swap)
	beatMu       sync.Mutex // one heartbeat at a time, so that none overtakes a newer one
	svc          micro.Service
	started      time.Time
	seq          atomic.Uint64
	sessions     map[string]*hostSession
	names        []string

	mu       sync.Mutex
	closing  bool
	poisoned map[string]bool
	calls    sync.WaitGroup
	runners  *runners // run the requests calls counts
	stop     chan struct{}
	kick     chan struct{} // a heartbeat now: a session's endpoint started or stopped
	beatDone chan struct{}
	// stopWatch stops the watch of the placement claims (exclusive
	// sessions only; nil without).
	stopWatch func()

	stats struct{ received, expired, claimedElsewhere, claims atomic.Uint64 }
	// hold, when set (tests), runs first in the handler of every session
	// call the host takes from the lattice: blocking in it stands for a
	// host that is stopped (SIGSTOP) before it read the call.
	hold atomic.Pointer[func()]
	// runningIDs are the call ids acknowledged and not yet answered, for
	// call status requests; statusSub takes those (failover.go).
	runningIDs runningCalls
	statusSub  *nats.Subscription
	whoSub     *nats.Subscription
	// onRun, when set (tests), is called with a call's id just before
	// the call starts on an instance.
	onRun atomic.Pointer[func(string)]
	// applyHold, when set (tests), runs first in every apply of the
	// lattice's desired module: blocking in it stands for a host slow
	// to apply, or away.
	applyHold atomic.Pointer[func()]
}

// HostStats counts the session calls a host took from the lattice.
type HostStats struct {
	// Received: calls handed to the host by the lattice (every copy).
	Received uint64 `json:"received"`
	// Expired: calls not started because their deadline had passed, when
	// they arrived or when an instance came free.
	Expired uint64 `json:"expired"`
	// ClaimedElsewhere: calls not started because another host had
	// claimed their id (a copy sent again ran there).
	ClaimedElsewhere uint64 `json:"claimed_elsewhere"`
	// Claims: call ids this host claimed in the calls bucket before it
	// started the call.
	Claims uint64 `json:"claims"`
}

// Stats counts the session calls the host took from the lattice.
func (h *Host) Stats() HostStats {
	return HostStats{Received: h.stats.received.Load(), Expired: h.stats.expired.Load(),
		ClaimedElsewhere: h.stats.claimedElsewhere.Load(), Claims: h.stats.claims.Load()}
}

type hostSession struct {
	name     string
	sess     *deploy.Pool
	stage    string // the manifest's stage module's sha256 (running(): the module it runs now)
	fence    string // the fence module's sha256, or ""
	tenant   string // the session's tenant, or ""
	inflight atomic.Int64
	// place is the claim state of a session with placement "exclusive";
	// nil for the others.
	place *placement
	// ep is the endpoint of a session that is not exclusive
	// (endpoints.go).
	ep sessionEndpoint
	// model is the module the session runs, as the lattice asked
	// (modelhost.go).
	model modelState
}

// NewHost joins d to a lattice over nc: it opens (creating them if
// needed) the lattice's buckets, swaps each session whose module the
// lattice swapped lattice-wide to that module (modelhost.go), registers
// an endpoint per session that can serve and two per resident session
// (start, status), and publishes its first heartbeat before it returns.
// It then follows the lattice's swaps until Close.
// Close leaves the lattice; nc stays the caller's.
func NewHost(ctx context.Context, nc *nats.Conn, d *deploy.Deployment, cfg HostConfig) (*Host, error) {
	cfg.defaults()
	if err := checkName("lattice", cfg.Lattice); err != nil {
		return nil, err
	}
	if err := checkName("host id", cfg.ID); err != nil {
		return nil, err
	}
	if cfg.TTL <= 0 || cfg.ClaimTTL <= 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "lattice %s: TTL %v and ClaimTTL %v must be set (the [lattice] table's heartbeat_ttl and claim_ttl)", cfg.Lattice, cfg.TTL, cfg.ClaimTTL)
	}
	if cfg.ClaimTTL < 2*cfg.TTL {
		return nil, fmt.Errorf("lattice: ClaimTTL %v is less than twice TTL %v: a holder renews its claims with each heartbeat", cfg.ClaimTTL, cfg.TTL)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	h := &Host{cfg: cfg, tracer: tracing.Tracer(cfg.TracerProvider), traced: tracing.Records(cfg.TracerProvider), nc: nc, d: d, started: time.Now().UTC(), sessions: map[string]*hostSession{},
		poisoned: map[string]bool{}, stop: make(chan struct{}), kick: make(chan struct{}, 1), beatDone: make(chan struct{}), modelsDone: make(chan struct{})}
	h.outputKeep.Store(int64(OutputKeep))
	h.runners = newRunners(h.stop)
	if h.hosts, err = openHosts(ctx, js, cfg.Lattice, cfg.TTL, cfg.Replicas); err != nil {
		return nil, err
	}
	if h.q, err = OpenQuarantine(ctx, js, cfg.Lattice, cfg.Replicas); err != nil {
		return nil, err
	}
	if h.payloads, err = openPayloads(ctx, nc, js, cfg.Lattice, cfg.Replicas, cfg.PayloadStoreMax); err != nil {
		_ = h.q.Close()
		return nil, err
	}
	if h.models, err = openModels(ctx, js, cfg.Lattice, cfg.Replicas); err != nil {
		_ = h.q.Close()
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = h.q.Close()
			_ = h.models.close()
			if h.svc != nil {
				_ = h.svc.Stop()
			}
			h.stopEndpoints()
		}
	}()
	if h.claims, err = OpenClaims(ctx, js, cfg.Lattice, cfg.ClaimTTL, cfg.Replicas); err != nil {
		return nil, err
	}
	if h.callIDs, err = openCalls(ctx, js, cfg.Lattice, cfg.Replicas); err != nil {
		return nil, err
	}
	h.svc, err = micro.AddService(nc, micro.Config{Name: ServiceName(cfg.Lattice), Version: "1.0.0",
		Description: "stagehost sessions", Metadata: map[string]string{"host": cfg.ID}})
	if err != nil {
		return nil, fmt.Errorf("lattice: micro service: %w", err)
	}
	for _, name := range d.SessionNames() {
		if err := checkName("session", name); err != nil {
			return nil, err
		}
		s := d.Pool(name)
		hs := &hostSession{name: name, sess: s, stage: d.Manifest.Module(s.Spec.Stage).SHA256, tenant: s.Spec.TenantName()}
		if m := d.Manifest.Module(s.Spec.Fence); m != nil {
			hs.fence = m.SHA256
		}
		h.sessions[name] = hs
		h.names = append(h.names, name)
		// A swap the lattice recorded applies before the host serves
		// the session (a host that restarts or joins late).
		h.applyDesired(ctx, hs) // modelhost.go
		if s.Exclusive() {
			hs.place = &placement{}
			continue // served while this host holds its claim (place)
		}
		if ok, why := h.canServe(hs); !ok {
			hs.ep.why = why // not served until it can: the heartbeat says why
			continue
		}
		svc, err := h.startEndpoint(hs) // endpoints.go
		if err != nil {
			return nil, err
		}
		hs.ep.svc = svc
	}
	if err := h.addResidents(); err != nil { // resident.go
		return nil, err
	}
	exclusive := false
	for _, name := range h.names {
		if hs := h.sessions[name]; hs.place != nil {
			h.place(ctx, hs)
			exclusive = true
		}
	}
	if exclusive {
		if h.stopWatch, err = h.watchClaims(context.WithoutCancel(ctx)); err != nil { // exclusive.go
			return nil, err
		}
	}
	if err := h.startFailover(); err != nil { // failover.go
		if h.stopWatch != nil {
			h.stopWatch()
		}
		return nil, fmt.Errorf("lattice: call status subscription: %w", err)
	}
	if err := h.beat(ctx); err != nil {
		if h.stopWatch != nil {
			h.stopWatch()
		}
		return nil, err
	}
	ok = true
	go h.heartbeats()
	go h.watchModels() // modelhost.go
	return h, nil
}

// addEndpoint adds hs's endpoint to svc: its session subject, in its
// queue group.
func (h *Host) addEndpoint(svc micro.Service, hs *hostSession) error {
	err := svc.AddEndpoint(hs.name, micro.HandlerFunc(func(req micro.Request) { h.handle(hs, req) }),
		micro.WithEndpointSubject(SessionSubject(h.cfg.Lattice, hs.name)),
		micro.WithEndpointQueueGroup(QueueGroup(h.cfg.Lattice, hs.name)),
		micro.WithEndpointMetadata(map[string]string{"session": hs.name, "stage_sha256": hs.running()}))
	if err != nil {
		return fmt.Errorf("lattice: endpoint for session %q: %w", hs.name, err)
	}
	return nil
}

// openHosts opens (creating it if needed) a lattice's hosts bucket. Its
// limit markers make an expired heartbeat visible to watchers.
func openHosts(ctx context.Context, js jetstream.JetStream, lattice string, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: HostsBucket(lattice), Description: "stagehost lattice " + lattice + ": host heartbeats",
		History: 1, TTL: ttl, LimitMarkerTTL: max(ttl, time.Second), Storage: jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: hosts bucket: %w", err)
	}
	return kv, nil
}

// ID is the host's id.
func (h *Host) ID() string { return h.cfg.ID }

// Quarantine is the lattice's shared quarantine, as this host sees it.
func (h *Host) Quarantine() *Quarantine { return h.q }

// Claims are the lattice's placement claims.
func (h *Host) Claims() *Claims { return h.claims }

// ClaimPlacement claims a session's placement key for this host.
func (h *Host) ClaimPlacement(ctx context.Context, session string) (*Claim, error) {
	return h.claims.Claim(ctx, PlacementKey(session), h.cfg.ID)
}

func (h *Host) heartbeats() {
	defer close(h.beatDone)
	t := time.NewTicker(h.cfg.TTL / 3)
	defer t.Stop()
	for {
		// A change to the shared quarantine changes which sessions the
		// host refuses: the heartbeat says so at once, so that fronts
		// route to (or away from) them without waiting for the tick.
		quarantined := h.q.changed.wait()
		select {
		case <-h.stop:
			return
		case <-h.kick:
			h.beatNow()
		case <-quarantined:
			for _, name := range h.names {
				h.updateEndpoint(h.sessions[name])
			}
			h.beatNow()
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.TTL/3)
			for _, name := range h.names {
				h.checkFences(h.sessions[name])
				if hs := h.sessions[name]; hs.place != nil {
					h.place(ctx, hs)
				} else {
					h.updateEndpoint(hs) // endpoints.go: after a reset or a swap, serving again
				}
			}
			cancel()
			h.beatNow()
		}
	}
}

// beatNow writes the heartbeat at once, logging a failure (within TTL/3).
func (h *Host) beatNow() {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.TTL/3)
	defer cancel()
	if err := h.beat(ctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		h.cfg.Logger.Warn("lattice heartbeat failed", "host", h.cfg.ID, "err", err)
	}
}

func (h *Host) beat(ctx context.Context) error {
	h.beatMu.Lock()
	defer h.beatMu.Unlock()
	b, err := json.Marshal(h.Record())
	if err != nil {
		return err
	}
	h.publishBeat(b) // over core NATS first: liveness without JetStream (failover.go)
	_, err = h.hosts.Put(ctx, h.cfg.ID, b)
	return err
}

// Record is the host's heartbeat as of now.
func (h *Host) Record() HostRecord {
	rec := HostRecord{Lattice: h.cfg.Lattice, ID: h.cfg.ID, Seq: h.seq.Add(1), At: time.Now().UTC(),
		Started: h.started, TTL: h.cfg.TTL, Devices: []DeviceHealth{}, Sessions: []SessionCapacity{}}
	for _, name := range h.d.DeviceNames() {
		dh := DeviceHealth{Name: name, Healthy: true}
		if err := h.d.DeviceErr(name); err != nil {
			dh.Healthy, dh.Error = false, deploy.PublicMessage(err)
		}
		rec.Devices = append(rec.Devices, dh)
	}
	for _, name := range h.names {
		hs := h.sessions[name]
		st := hs.sess.Status()
		sc := SessionCapacity{Name: name, StageSHA256: hs.running(), Module: st.Stage, State: st.State, Reason: publicLine(st.Reason),
			Instances: len(st.Instances), Out: st.InstancesOut, Waiting: st.Waiting, InFlight: int(hs.inflight.Load()), Outcomes: st.Outcomes}
		sc.Free = max(sc.Instances-sc.Out-sc.InFlight, 0)
		if p, ok := h.refused(hs); ok {
			sc.State, sc.Reason = "refused", refusal(h.cfg.ID, p).Message
		}
		if hs.place != nil {
			sc.Placement = placementExclusive
			if sc.State == "ready" && !hs.place.holds() {
				sc.State, sc.Reason = "standby", hs.place.standby(h)
			}
		}
		h.modelFields(hs, &sc) // modelhost.go
		sc.Serving = sc.State == "ready"
		if hs.place == nil && sc.Serving {
			// Ready, and taking the lattice's calls only with its
			// endpoint started (endpoints.go).
			hs.ep.mu.Lock()
			if hs.ep.svc == nil {
				sc.Serving, sc.Reason = false, "its endpoint is not started: "+hs.ep.why
			}
			hs.ep.mu.Unlock()
		}
		rec.Sessions = append(rec.Sessions, sc)
		for _, is := range st.Instances {
			if is.State != "ready" {
				rec.Quarantines = append(rec.Quarantines, InstanceQuarantine{Session: name, Instance: is.Index, State: is.State, Reason: publicLine(is.Reason)})
			}
		}
	}
	rec.Residents = h.residents() // resident.go
	rec.Calls = h.Stats()
	rec.Reconnects = h.nc.Stats().Reconnects
	if h.cfg.Readiness != nil {
		rec.Readiness = h.cfg.Readiness()
	} else {
		rec.Readiness = h.readiness(rec)
	}
	return rec
}

// readiness is Server.Readiness's rule (ready_quarantined_share 0) over a
// heartbeat's devices and sessions.
func (h *Host) readiness(rec HostRecord) deploy.Readiness {
	var reasons []string
	for _, dv := range rec.Devices {
		if !dv.Healthy {
			reasons = append(reasons, fmt.Sprintf("device %s is lost: %s", dv.Name, dv.Error))
		}
	}
	for _, sc := range rec.Sessions {
		if sc.State == "failed" || sc.Out > 0 {
			reasons = append(reasons, fmt.Sprintf("session %s is %s: %s", sc.Name, sc.State, sc.Reason))
		}
	}
	if len(reasons) > 0 {
		return deploy.Readiness{Status: "not_ready", Reasons: reasons}
	}
	return deploy.Readiness{Ready: true, Status: "ready"}
}

// refused says whether a session's stage or fence module, or its tenant
// ([TenantKey]), is in the shared quarantine.
func (h *Host) refused(hs *hostSession) (Poison, bool) {
	if hs.tenant != "" {
		if p, ok := h.q.Lookup(TenantKey(hs.tenant)); ok {
			return p, true
		}
	}
	if p, ok := h.q.Lookup(hs.running()); ok {
		return p, true
	}
	if hs.fence != "" {
		return h.q.Lookup(hs.fence)
	}
	return Poison{}, false
}

// Call runs a call to one of the host's sessions on a local instance,
// waiting for one as the session's queue allows: what an endpoint does
// with a lattice request. The error is the session's (classify it with
// [Class]), or an [*Error]: not_found for an unknown session, unavailable
// for a module in the shared quarantine.
func (h *Host) Call(ctx context.Context, session string, input []byte) ([]byte, error) {
	out, _, err := h.call(ctx, session, input, nil)
	return out, err
}

// call is Call, and says whether the call ran: false when it failed
// before it had an instance, or did not start on it. A call whose
// context's deadline passed by the time it has an instance is not
// started (deadline_exceeded); nor is one whose gate, run just before
// it would start, returns an error (that error).
func (h *Host) call(ctx context.Context, session string, input []byte, gate func() error) (out []byte, ran bool, err error) {
	hs := h.sessions[session]
	if hs == nil {
		return nil, false, &Error{Class: errdefs.ClassNotFound, Message: fmt.Sprintf("no session %q on host %s", session, h.cfg.ID), Host: h.cfg.ID}
	}
	if p, ok := h.refused(hs); ok {
		return nil, false, refusal(h.cfg.ID, p)
	}
	if why := h.unapplied(hs); why != "" {
		return nil, false, unavailable(h.cfg.ID, "session %q on host %s: %s", session, h.cfg.ID, why)
	}
	if hs.place != nil && !hs.place.holds() {
		return nil, false, &Error{Class: errdefs.ClassUnavailable, Host: h.cfg.ID,
			Message: fmt.Sprintf("session %q on host %s: %s", session, h.cfg.ID, hs.place.standby(h))}
	}
	hs.inflight.Add(1)
	defer hs.inflight.Add(-1)
	turn, err := hs.sess.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := h.runnable(hs, turn); err != nil {
		turn.Release()
		return nil, false, err
	}
	if err := h.startable(ctx, session); err != nil {
		turn.Release()
		return nil, false, err
	}
	if gate != nil {
		if err := gate(); err != nil {
			turn.Release()
			return nil, false, err
		}
	}
	out, err = h.run(ctx, hs, turn, input)
	return out, true, err
}

// startable is nil unless ctx's deadline has passed: a call is never
// started after its deadline, measured when it would start (after its
// wait for an instance).
func (h *Host) startable(ctx context.Context, session string) error {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		h.stats.expired.Add(1)
		return &Error{Class: errdefs.ClassDeadlineExceeded, Host: h.cfg.ID,
			Message: fmt.Sprintf("session %q: the deadline passed before the call started on host %s", session, h.cfg.ID)}
	}
	return nil
}

// tryCall runs a call locally only if an instance of the session is free
// at once; ok is false (nothing ran) otherwise.
func (h *Host) tryCall(ctx context.Context, session string, input []byte) (out []byte, err error, ok bool) {
	hs := h.sessions[session]
	if hs == nil || hs.sess.Failed() != nil {
		return nil, nil, false
	}
	if _, refused := h.refused(hs); refused {
		return nil, nil, false
	}
	if h.unapplied(hs) != "" {
		return nil, nil, false // behind the lattice's module: through the lattice
	}
	if hs.place != nil && !hs.place.holds() {
		return nil, nil, false // another host serves it: through the lattice
	}
	turn := hs.sess.TryAcquire() // a free instance now, or nil; counts nothing
	if turn == nil {
		return nil, nil, false
	}
	if h.runnable(hs, turn) != nil {
		turn.Release()
		return nil, nil, false // refused here: the front decides, by its own view
	}
	if err := h.startable(ctx, session); err != nil {
		turn.Release()
		return nil, err, true
	}
	hs.inflight.Add(1)
	defer hs.inflight.Add(-1)
	out, err = h.run(ctx, hs, turn, input)
	return out, err, true
}

// waitCall runs a call locally, waiting for an instance within ctx's
// deadline and the session's queue_timeout, when the host serves the
// session (not failed, not refused, not standing by); ok is false
// (nothing ran) otherwise. A front uses it while it cannot reach NATS.
func (h *Host) waitCall(ctx context.Context, session string, input []byte) (out []byte, err error, ok bool) {
	hs := h.sessions[session]
	if hs == nil || hs.sess.Failed() != nil {
		return nil, nil, false
	}
	if _, refused := h.refused(hs); refused {
		return nil, nil, false
	}
	if hs.place != nil && !hs.place.holds() {
		return nil, nil, false
	}
	out, _, err = h.call(ctx, session, input, nil)
	return out, err, true
}

func (h *Host) run(ctx context.Context, hs *hostSession, turn *deploy.Turn, input []byte) ([]byte, error) {
	_, dev := turn.Instance()
	sha := turn.StageSHA256()
	lostBefore := h.d.DeviceErr(dev) != nil
	out, err := turn.Run(ctx, input)
	turn.Release()
	// Only a device_lost error, a quarantine or a lost device (a
	// quarantine is always one: stages.Session.Run), changes what the
	// session can serve: a stage's own errors (client_error, a trap,
	// whose instance is replaced) cost no status read.
	if err != nil && errdefs.ClassOf(err) == errdefs.ErrDeviceLost {
		if !lostBefore && !h.cfg.NoDeviceLostQuarantine {
			if derr := h.d.DeviceErr(dev); derr != nil {
				h.poison(hs, sha, fmt.Sprintf("a call to session %s made device %s on host %s lost: %s", hs.name, dev, h.cfg.ID, deploy.PublicMessage(derr)))
			}
		}
		h.checkFences(hs)
		h.syncEndpoint(hs) // the call may have taken the last instance out of service
	}
	return out, err
}

// checkFences puts hs's stage module in the shared quarantine once
// FenceFailures instances of its sessions on this host are quarantined.
func (h *Host) checkFences(hs *hostSession) {
	if h.cfg.FenceFailures <= 0 {
		return
	}
	sha := hs.running()
	n, first := 0, ""
	for _, other := range h.sessions {
		if other.running() != sha || other.sess.Failed() != nil {
			continue
		}
		for _, is := range other.sess.Status().Instances {
			if is.State == "quarantined" {
				n++
				if first == "" {
					first = publicLine(is.Reason)
				}
			}
		}
	}
	if n >= h.cfg.FenceFailures {
		h.poison(hs, sha, fmt.Sprintf("%d instances of its sessions were quarantined on host %s (fence failed; limit %d): %s", n, h.cfg.ID, h.cfg.FenceFailures, first))
	}
}

// poison puts module sha, which hs's call ran, in the shared quarantine.
func (h *Host) poison(hs *hostSession, sha, reason string) {
	h.mu.Lock()
	done := h.poisoned[sha]
	h.poisoned[sha] = true
	h.mu.Unlock()
	if done {
		return
	}
	h.cfg.Logger.Warn("lattice: quarantining module lattice-wide", "host", h.cfg.ID, "session", hs.name, "sha256", sha, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.q.Poison(ctx, Poison{SHA256: sha, Reason: reason, Host: h.cfg.ID, Session: hs.name}); err != nil {
		h.cfg.Logger.Error("lattice: quarantining module failed", "host", h.cfg.ID, "sha256", sha, "err", err)
		h.mu.Lock()
		delete(h.poisoned, sha)
		h.mu.Unlock()
	}
}

// handle takes one lattice request: the call runs in a goroutine of its
// own, so one session's calls run in parallel on its instances.
func (h *Host) handle(hs *hostSession, req micro.Request) {
	if hold := h.hold.Load(); hold != nil {
		(*hold)()
	}
	h.goServe(req, func() { h.serve(hs, req) })
}

// goServe runs one lattice request (a session call, a resident request)
// in a goroutine of its own (a runner's), counted in the calls Close waits for. While
// the host is leaving it runs nothing: a request that asked for an
// acknowledgement is neither acknowledged nor answered, so its front
// sends it again, to a host that stays (the server stops handing this
// host requests once its endpoints stopped, a moment from now); any
// other is answered 503 unavailable.
func (h *Host) goServe(req micro.Request, serve func()) {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		if req.Headers().Get(AckHeader) == "" {
			h.respondError(req, unavailable(h.cfg.ID, "host %s is leaving the lattice", h.cfg.ID))
		}
		return
	}
	h.calls.Add(1)
	h.mu.Unlock()
	h.runners.run(func() {
		defer h.calls.Done()
		serve()
	})
}

func (h *Host) serve(hs *hostSession, req micro.Request) {
	start := time.Now()
	hdr := req.Headers()
	h.stats.received.Add(1)
	rid := hdr.Get(RequestIDHeader)
	terms, terr := readTerms(nats.Header(hdr), start)
	if terr == nil && !terms.deadline.IsZero() && !start.Before(terms.deadline) {
		// Its front has answered it (or will, at the deadline): it is
		// neither acknowledged, started nor answered.
		h.stats.expired.Add(1)
		h.cfg.Logger.Debug("lattice call not started: its deadline passed before it arrived", "host", h.cfg.ID, "session", hs.name, "request_id", rid, "call_id", terms.id)
		return
	}
	claimed := uint64(0) // the revision of this host's claim of the call, 0 for none
	if terr == nil && terms.mustClaim(start) {
		// A copy sent again, or one older than its acknowledgement
		// window: another host may hold (or have run) a copy. Claimed
		// before the acknowledgement, so that a host that does not run
		// it does not acknowledge it.
		rev, cerr := h.claimCall(hs, terms, rid)
		if rev == 0 {
			if cerr != nil {
				h.respondError(req, cerr)
			}
			return
		}
		claimed = rev
	}
	tp := hdr.Get(TraceparentHeader)
	ctx, span := h.startServe(hs, hdr) // trace.go
	acked := hdr.Get(AckHeader) != ""
	if acked && terms.id != "" {
		// Until it is answered, a front that lost its connection
		// meanwhile hears "running" when it asks (failover.go).
		h.runningIDs.add(terms.id)
		defer h.runningIDs.done(terms.id, terms.deadline)
	}
	if acked {
		_ = h.respond(req, nil, nats.Header{HostHeader: {h.cfg.ID}, AckHeader: {"1"}})
	}
	ctx = requestid.With(ctx, rid)
	var err error
	var out []byte
	if terr != nil {
		err = errdefs.Errorf(errdefs.ErrInvalidArgument, "%v", terr)
	} else if !terms.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, terms.deadline)
		defer cancel()
	}
	// gate runs just before the call would start on its instance: a
	// call not yet claimed is claimed there when its acknowledgement
	// window has passed meanwhile (it waited for an instance), or when
	// its acknowledgement may not have left the process yet (a host
	// stopped now would run it later, after its front sent it again).
	var claimGate func() error
	gate := func() error {
		if err := claimGate(); err != nil {
			return err
		}
		if fn := h.onRun.Load(); fn != nil {
			(*fn)(terms.id)
		}
		return nil
	}
	claimGate = func() error {
		if claimed != 0 || !terms.claims {
			return nil
		}
		if !terms.mustClaim(time.Now()) && !(acked && !h.ackConfirmed(terms)) {
			return nil
		}
		rev, cerr := h.claimCall(hs, terms, rid)
		if rev == 0 {
			if cerr == nil {
				return errClaimedElsewhere
			}
			return cerr
		}
		claimed = rev
		return nil
	}
	answer := nats.Header{HostHeader: {h.cfg.ID}}
	if err == nil {
		// The front's committed revision, or this host's own view's.
		rev, _ := strconv.ParseUint(hdr.Get(ModelRevisionHeader), 10, 64)
		if rev = max(rev, h.models.committed(hs.name)); h.behindCall(hs, rev) { // modelhost.go
			// The front knows a swap this host missed: the call runs
			// nowhere here, and its front sends it again.
			err = unavailable(h.cfg.ID, "session %q: host %s has not applied revision %d of the lattice's module for it yet", hs.name, h.cfg.ID, rev)
			answer[NotRunHeader] = []string{"1"}
			if claimed != 0 {
				h.callIDs.release(terms.id, claimed)
			}
			h.syncEndpoint(hs)
		}
	}
	input := req.Data()
	if name := hdr.Get(PayloadHeader); name != "" && err == nil {
		input, err = h.readInput(ctx, hs, name)
	}
	if err == nil && int64(len(input)) > hs.sess.Spec.MaxInput {
		err = h.overMaxInput(hs, uint64(len(input)))
	}
	if err == nil {
		var ran bool
		out, ran, err = h.call(ctx, hs.name, input, gate)
		if errors.Is(err, errClaimedElsewhere) {
			endServe(span, time.Since(start), nil)
			return // another host runs it: answered by that host
		}
		if !ran && Class(err) == errdefs.ClassDeviceLost {
			// Every instance went out of service while the call waited
			// for one: it ran nowhere. This host leaves the session's
			// queue group (flushed) before it answers, and the answer
			// tells the front to send the call again, to a host that
			// can run it.
			h.syncEndpoint(hs)
			answer[NotRunHeader] = []string{"1"}
			if claimed != 0 {
				// The copy sent again must be free to run elsewhere.
				h.callIDs.release(terms.id, claimed)
			}
		}
	}
	if err == nil && !h.payloads.fits(len(out)) {
		var name string
		if name, err = h.storeOutput(ctx, hs.name, out); err == nil {
			out, answer[PayloadHeader] = nil, []string{name}
		}
	}
	class := Class(err)
	endServe(span, time.Since(start), err) // before the answer: the caller sees it ended
	if err == nil {
		h.cfg.Logger.Debug("lattice call", "host", h.cfg.ID, "session", hs.name, "traceparent", tp, "request_id", rid, "class", class, "took", time.Since(start))
		object := answer.Get(PayloadHeader)
		if fn := h.beforeAnswer.Load(); object != "" && fn != nil {
			(*fn)()
		}
		if acked && terms.id != "" {
			h.runningIDs.keep(terms.id, &nats.Msg{Subject: req.Reply(), Data: out, Header: answer}) // failover.go
		}
		if rerr := h.respond(req, out, answer); rerr != nil {
			h.cfg.Logger.Warn("lattice: answering a call failed", "host", h.cfg.ID, "session", hs.name, "request_id", rid, "err", rerr)
			if object != "" {
				h.payloads.remove(object)
			}
			return
		}
		if object != "" {
			// The front deletes it once read, or when the answer finds
			// no call waiting; this deletes it where the front is gone.
			time.AfterFunc(time.Duration(h.outputKeep.Load()), func() { h.payloads.remove(object) })
		}
		return
	}
	// The full error (a guest stack trace included) goes to the log; the
	// caller gets the public message.
	h.cfg.Logger.Info("lattice call failed", "host", h.cfg.ID, "session", hs.name, "traceparent", tp, "request_id", rid, "class", class, "took", time.Since(start), "err", err)
	h.respondErrorWith(req, err, answer)
}

// claimTimeout bounds a claim for a call that carries no deadline: the
// front's default deadline (FrontConfig.DefaultDeadline's default).
const claimTimeout = 30 * time.Second

// claimCall claims a call's id for this host in the calls bucket, within
// the call's deadline. It returns the claim's revision; 0 with a nil
// error when another host holds it (the call is not started and not
// answered here), 0 with an error (unavailable, to answer) when the
// bucket could not be reached.
func (h *Host) claimCall(hs *hostSession, terms callTerms, rid string) (uint64, error) {
	// A call without a deadline (a request of an older front) still gets
	// a bounded claim: the front's default deadline.
	until := terms.deadline
	if until.IsZero() {
		until = time.Now().Add(claimTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	rev, err := h.callIDs.claim(ctx, terms.id, h.cfg.ID, terms.deadline)
	switch {
	case err == nil:
		h.stats.claims.Add(1)
		return rev, nil
	case errors.Is(err, errClaimedElsewhere):
		h.stats.claimedElsewhere.Add(1)
		h.cfg.Logger.Debug("lattice call not started: another host claimed it", "host", h.cfg.ID, "session", hs.name, "request_id", rid, "call_id", terms.id)
		return 0, nil
	case ctx.Err() != nil:
		h.stats.expired.Add(1)
		return 0, nil // past its deadline: not started, not answered
	}
	return 0, unavailable(h.cfg.ID, "session %q: claiming the call in the lattice's calls bucket on host %s: %v", hs.name, h.cfg.ID, err)
}

// ackConfirmed says whether the server has the call's acknowledgement
// (a PING answered after it, before the call's acknowledgement window
// ends): a call whose acknowledgement may be lost (the connection
// dropped, or stands still) is claimed before it starts, since its front
// will send it again.
func (h *Host) ackConfirmed(terms callTerms) bool {
	wait := time.Until(terms.claimAfter)
	if terms.claimAlways || wait <= 0 {
		return false
	}
	return h.nc.FlushTimeout(wait) == nil
}

// outputGrace is how long past a call's deadline its host may take to
// store its output: the front's default Grace.
const outputGrace = 250 * time.Millisecond

// overMaxInput is the error of a call whose input is larger than its
// session's max_input. The limit holds whoever sent the call: a front
// that does not know the session's spec applies only the default.
func (h *Host) overMaxInput(hs *hostSession, n uint64) error {
	return &Error{Class: errdefs.ClassOutOfBudget, Host: h.cfg.ID,
		Message: fmt.Sprintf("the input of %d bytes is larger than session %q's max_input of %d bytes (on host %s)", n, hs.name, hs.sess.Spec.MaxInput, h.cfg.ID)}
}

// readInput reads a call's input from the payload store (the request
// named its object), within the call's deadline; an object larger than
// the session's max_input is refused before it is read.
func (h *Host) readInput(ctx context.Context, hs *hostSession, name string) ([]byte, error) {
	session := hs.name
	b, err := h.payloads.get(ctx, name, hs.sess.Spec.MaxInput)
	if err == nil {
		return b, nil
	}
	if tl := (*tooLarge)(nil); errors.As(err, &tl) {
		return nil, h.overMaxInput(hs, tl.size)
	}
	if ctx.Err() != nil {
		return nil, &Error{Class: errdefs.ClassDeadlineExceeded, Host: h.cfg.ID,
			Message: fmt.Sprintf("session %q: the deadline passed while reading the call's input from the lattice's payload store", session)}
	}
	return nil, unavailable(h.cfg.ID, "session %q: reading the call's input (object %s) from the lattice's payload store: %v", session, name, err)
}

// storeOutput puts a call's output that one message cannot carry in the
// payload store, and returns the object's name for the answer, within
// the call's deadline plus outputGrace (a front waits that long past the
// deadline for the answer, with the default FrontConfig.Grace), or
// payloadTimeout for a call without a deadline.
func (h *Host) storeOutput(ctx context.Context, session string, out []byte) (string, error) {
	// The call has run and used up some of its deadline: the output is
	// stored for as long as a front waits for the answer past it.
	dl := time.Now().Add(payloadTimeout)
	if d, ok := ctx.Deadline(); ok {
		dl = d.Add(outputGrace)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	defer cancel()
	name, err := h.payloads.put(ctx, out)
	if over := (*overStoreLimit)(nil); errors.As(err, &over) {
		return "", &Error{Class: errdefs.ClassOutOfBudget, Host: h.cfg.ID,
			Message: fmt.Sprintf("session %q: the output of %d bytes is larger than the lattice's payload store holds (payload_store_max %d bytes)", session, len(out), over.limit)}
	}
	if err != nil {
		return "", unavailable(h.cfg.ID, "session %q: storing an output of %d bytes in the lattice's payload store: %v", session, len(out), err)
	}
	return name, nil
}

// Close leaves the lattice: the host takes no new call (its endpoints
// stop) and deletes its heartbeat, so that fronts stop counting it at
// once, then answers the calls in flight (or ctx ends). It works, and
// returns nil, after nc was closed too.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		return nil
	}
	h.closing = true
	h.mu.Unlock()
	_ = h.svc.Stop()
	h.stopEndpoints()
	close(h.stop)
	if h.statusSub != nil {
		_ = h.statusSub.Unsubscribe()
		_ = h.whoSub.Unsubscribe()
	}
	<-h.beatDone
	<-h.modelsDone
	if h.stopWatch != nil {
		h.stopWatch()
	}
	h.stopExclusive()
	var err error
	if !h.nc.IsClosed() {
		// Past the TTL the heartbeat has expired anyway (a disconnected
		// host waits no longer than that).
		dctx, cancel := context.WithTimeout(ctx, h.cfg.TTL)
		if derr := h.hosts.Delete(dctx, h.cfg.ID); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
			err = derr
		}
		cancel()
	}
	done := make(chan struct{})
	go func() { h.calls.Wait(); close(done) }()
	select {
	case <-done:
		if !h.nc.IsClosed() {
			rctx, cancel := context.WithTimeout(ctx, h.cfg.TTL)
			h.releaseClaims(rctx)
			cancel()
		}
	case <-ctx.Done():
		// Claims of calls still running are left to expire.
		err = errors.Join(err, fmt.Errorf("lattice: host %s: calls still in flight: %w", h.cfg.ID, ctx.Err()))
	}
	return errors.Join(err, h.q.Close(), h.models.close())
}

// sortedHosts sorts heartbeats by id.
func sortedHosts(m map[string]*liveHost) []HostRecord {
	out := make([]HostRecord, 0, len(m))
	for _, lh := range m {
		out = append(out, lh.rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// publicLine is deploy.PublicMessage of a reason string ("" for "").
func publicLine(s string) string {
	if s == "" {
		return ""
	}
	return deploy.PublicMessage(errors.New(s))
}

// stageCode is the stage's code of a client_error.
func stageCode(err error) (int32, bool) {
	var ce *stages.ClientError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	return 0, false
}
