package lattice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/requestid"
)

// ResidentCapacity is one resident session of a heartbeat.
type ResidentCapacity struct {
	Name string `json:"name"`
	GPU  string `json:"gpu"` // the resident's gpu device
	NPU  string `json:"npu"` // its npu device
	// Running counts the runs started and not yet finished, at most
	// MaxRuns.
	Running int `json:"running"`
	MaxRuns int `json:"max_runs"`
	// Quarantined counts the quarantined runs, which keep their
	// resources; at MaxQuarantined the host refuses every start.
	Quarantined    int `json:"quarantined"`
	MaxQuarantined int `json:"max_quarantined"`
}

// addResidents registers the start and status endpoints of each resident
// session of the host's deployment, in the resident's queue group.
func (h *Host) addResidents() error {
	for _, name := range h.d.ResidentNames() {
		if err := checkName("resident", name); err != nil {
			return err
		}
		for _, ep := range []struct {
			op, subject string
			start       bool
		}{
			{"start", ResidentStartSubject(h.cfg.Lattice, name), true},
			{"status", ResidentStatusSubject(h.cfg.Lattice, name), false},
		} {
			start := ep.start
			err := h.svc.AddEndpoint("resident-"+name+"-"+ep.op,
				micro.HandlerFunc(func(req micro.Request) { h.handleResident(name, start, req) }),
				micro.WithEndpointSubject(ep.subject),
				micro.WithEndpointQueueGroup(ResidentQueueGroup(h.cfg.Lattice, name)),
				micro.WithEndpointMetadata(map[string]string{"resident": name, "op": ep.op}))
			if err != nil {
				return fmt.Errorf("lattice: %s endpoint for resident %q: %w", ep.op, name, err)
			}
		}
	}
	return nil
}

// residents is the heartbeat's list of the host's resident sessions.
func (h *Host) residents() []ResidentCapacity {
	out := []ResidentCapacity{}
	for _, name := range h.d.ResidentNames() {
		res := h.d.Resident(name)
		out = append(out, ResidentCapacity{Name: name, GPU: res.Spec.GPU, NPU: res.Spec.NPU,
			Running: res.Running(), MaxRuns: res.Spec.MaxRuns,
			Quarantined: len(res.Quarantined()), MaxQuarantined: res.Spec.MaxQuarantined})
	}
	return out
}

// handleResident takes one lattice request to a resident session: in a
// goroutine of its own (a start waits for its run to be admitted and
// started), refused unavailable while the host is leaving.
func (h *Host) handleResident(name string, start bool, req micro.Request) {
	h.goServe(req, func() { h.serveResident(name, start, req) }) // host.go
}

func (h *Host) serveResident(name string, start bool, req micro.Request) {
	begin := time.Now()
	if req.Headers().Get(AckHeader) != "" {
		_ = h.respond(req, nil, nats.Header{HostHeader: {h.cfg.ID}, AckHeader: {"1"}})
	}
	rid := req.Headers().Get(RequestIDHeader)
	op := "status"
	var out []byte
	var err error
	if start {
		op = "start"
		// The run outlives the request: its joins continue in the
		// background.
		out, err = h.startResident(requestid.With(context.Background(), rid), name)
	} else {
		out, err = h.residentStatus(name)
	}
	if err != nil {
		h.cfg.Logger.Info("lattice resident request failed", "host", h.cfg.ID, "resident", name, "op", op,
			"request_id", rid, "class", Class(err), "took", time.Since(begin), "err", err)
		h.respondError(req, err)
		return
	}
	h.cfg.Logger.Debug("lattice resident request", "host", h.cfg.ID, "resident", name, "op", op, "request_id", rid, "took", time.Since(begin))
	_ = h.respond(req, out, nats.Header{HostHeader: {h.cfg.ID}})
}

// respondError answers a lattice request (a session call or a resident
// request) with err: the class header, the micro error headers (the
// class's HTTP status and the public message) and an [Error] as JSON,
// with the stage's code of a client_error. The full error stays in the
// host's log.
func (h *Host) respondError(req micro.Request, err error) {
	h.respondErrorWith(req, err, nats.Header{HostHeader: {h.cfg.ID}})
}

// respondErrorWith is respondError with more headers (HostHeader among
// them).
func (h *Host) respondErrorWith(req micro.Request, err error, hdr nats.Header) {
	class := Class(err)
	body := Error{Class: class, Message: deploy.PublicMessage(err), Host: h.cfg.ID}
	if le := (*Error)(nil); errors.As(err, &le) {
		body.Code = le.Code
	} else if code, ok := stageCode(err); ok {
		body.Code = &code
	}
	if body.Message == "" {
		body.Message = class
	}
	b, _ := json.Marshal(body)
	hdr.Set(ClassHeader, class)
	hdr.Set(micro.ErrorHeader, body.Message)
	hdr.Set(micro.ErrorCodeHeader, strconv.Itoa(errdefs.HTTPStatus(class)))
	_ = h.respond(req, b, hdr)
}

// respond publishes a lattice request's answer (or error answer: micro's
// error headers, as micro.Request.Error writes them) to its reply
// subject. The requests are answered by goroutines of their own, after
// micro's handler returned, and micro's Request methods are not made for
// that: they record an error for the endpoint's statistics, which micro
// reads once the handler returns (a data race). So the host answers on
// the connection itself; the endpoint's statistics count requests, not
// their errors.
func (h *Host) respond(req micro.Request, data []byte, hdr nats.Header) error {
	return h.nc.PublishMsg(&nats.Msg{Subject: req.Reply(), Data: data, Header: hdr})
}

// startResident starts a run of one of the host's resident sessions and
// returns its [deploy.ResidentStart] as JSON. ctx is the run's: it must
// outlive the request.
func (h *Host) startResident(ctx context.Context, name string) ([]byte, error) {
	res := h.d.Resident(name)
	if res == nil {
		return nil, h.noResident(name)
	}
	st, err := res.StartRun(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(st)
}

// residentStatus is one of the host's resident sessions' status
// ([deploy.ResidentStatus]) as JSON.
func (h *Host) residentStatus(name string) ([]byte, error) {
	res := h.d.Resident(name)
	if res == nil {
		return nil, h.noResident(name)
	}
	return json.Marshal(res.Status())
}

func (h *Host) noResident(name string) *Error {
	return &Error{Class: errdefs.ClassNotFound, Message: fmt.Sprintf("no resident session %q on host %s", name, h.cfg.ID), Host: h.cfg.ID}
}

// KnownResident reports whether a heartbeat named the resident session
// since the front started (a live host has it, or had it).
func (f *Front) KnownResident(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.knownResidents[name]
}

// ResidentHosts lists the live hosts that have a resident session,
// sorted by id.
func (f *Front) ResidentHosts(name string) []string {
	var ids []string
	for _, rec := range f.Hosts() {
		for _, rc := range rec.Residents {
			if rc.Name == name {
				ids = append(ids, rec.ID)
			}
		}
	}
	sort.Strings(ids)
	return ids
}

// StartResident starts a run of a resident session: on the local host
// (FrontConfig.Local) when it has the resident, else on a live host that
// has it, through the lattice, with an acknowledgement asked for, and
// ctx's deadline or DefaultDeadline; the run outlives ctx. The request
// is sent once, never again, even when no host acknowledged it (a start
// is not idempotent). The answer is the host's [deploy.ResidentStart]
// as JSON.
//
// # Errors
//
// An [*Error] with the service's class: unavailable (503) when no live
// host has the resident, no host responds, no host acknowledged the
// start within the deadline, or the host that acknowledged it went away
// (its heartbeat expired; the run may have started); deadline_exceeded
// when the host that acknowledged it did not answer within the deadline
// (the run may have started); client_closed when ctx was canceled
// first; or the host's refusal (busy, device_lost, …). A start on the local host fails with the
// resident's own errors (classify them with [Class]).
func (f *Front) StartResident(ctx context.Context, name string) ([]byte, error) {
	if l := f.cfg.Local; l != nil && l.d.Resident(name) != nil {
		return l.startResident(context.WithoutCancel(ctx), name)
	}
	return f.residentRequest(ctx, name, "start", ResidentStartSubject(f.cfg.Lattice, name))
}

// ResidentStatus is a resident session's state, the host's
// [deploy.ResidentStatus] as JSON: the local host's when it has the
// resident, else that of a live host that has it. Run ids are each
// host's own. Errors as StartResident's.
func (f *Front) ResidentStatus(ctx context.Context, name string) ([]byte, error) {
	if l := f.cfg.Local; l != nil && l.d.Resident(name) != nil {
		return l.residentStatus(name)
	}
	return f.residentRequest(ctx, name, "status", ResidentStatusSubject(f.cfg.Lattice, name))
}

// residentRequest sends one request to a resident's endpoint, as a
// session call is sent (roundTrip: an acknowledgement asked for, so a
// request on a host that dies is answered "went away" when its heartbeat
// expires), and decodes the answer. A status request no host
// acknowledged within AckTimeout is sent again; a start never is.
func (f *Front) residentRequest(ctx context.Context, name, op, subject string) ([]byte, error) {
	if len(f.ResidentHosts(name)) == 0 {
		return nil, unavailable("", "resident %q is on no live host of lattice %s", name, f.cfg.Lattice)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(f.cfg.DefaultDeadline)
	}
	msg := nats.NewMsg(subject)
	if rid := requestid.FromContext(ctx); rid != "" {
		msg.Header.Set(RequestIDHeader, rid)
	}
	x := exchange{kind: "resident", name: name, noun: "status request", resend: true}
	if op == "start" {
		x = exchange{kind: "resident", name: name, noun: "start", deadlineNote: " (the run may have started)"}
	}
	c := &call{ch: make(chan *nats.Msg, 1), gone: make(chan struct{}), span: trace.SpanFromContext(ctx)}
	m, err := f.roundTrip(ctx, c, msg, deadline, x)
	if err != nil {
		return nil, err
	}
	if m.Header.Get("Status") == "503" { // the server's no-responders answer
		return nil, unavailable("", "resident %q: no host of lattice %s responds (no responders)", name, f.cfg.Lattice)
	}
	return decodeAnswer(m)
}
