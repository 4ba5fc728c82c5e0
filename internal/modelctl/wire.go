package modelctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// Subject is the subject of host's model-control endpoint in lattice: a
// worker of `serve --supervise` subscribes to it (no queue group: each
// request is for that host).
func Subject(lattice, host string) string {
	return "stagehost." + lattice + ".host." + host + ".model"
}

// The operations of a [Request].
const (
	OpModules = "modules" // list the loaded module versions
	OpLoad    = "load"    // load Module, its bytes read from the store
	OpUnload  = "unload"  // unload Ref (name or name@sha256)
	OpSwap    = "swap"    // swap Session to Stage
	OpReset   = "reset"   // reset Session
	// OpRestore applies the store's state again ([Restore]): the
	// supervisor sends it to a worker whose ready report names an older
	// revision than the store's (the state changed while it started).
	OpRestore = "restore"
)

// Request is one model-control request to a worker.
type Request struct {
	Op      string                `json:"op"`
	Module  *deploy.ModuleRequest `json:"module,omitempty"`
	Source  string                `json:"source,omitempty"` // load: "upload" or "path"
	Ref     string                `json:"ref,omitempty"`
	Session string                `json:"session,omitempty"`
	Stage   string                `json:"stage,omitempty"`
	// Timeout is what is left of the caller's deadline; the worker
	// applies it to the operation.
	Timeout time.Duration `json:"timeout_ns,omitempty"`
}

// Reply is a worker's answer. An error answer has Class (errdefs' wire
// names) and Error; an answer of reset may have both a result and an
// error (some instances could not be replaced).
type Reply struct {
	Host     string              `json:"host"`
	Class    string              `json:"class,omitempty"`
	Error    string              `json:"error,omitempty"`
	Modules  []deploy.ModuleInfo `json:"modules,omitempty"`
	Module   *deploy.ModuleInfo  `json:"module,omitempty"`
	Created  bool                `json:"created,omitempty"`
	Unloaded []deploy.ModuleInfo `json:"unloaded,omitempty"`
	Swap     *deploy.SwapResult  `json:"swap,omitempty"`
	Reset    *deploy.ResetResult `json:"reset,omitempty"`
	// ManifestStage is, for a swap, the session's stage in the worker's
	// manifest (name@sha256), for the swap's record.
	ManifestStage string `json:"manifest_stage,omitempty"`
	// Restored is the answer of OpRestore.
	Restored *Restored `json:"restored,omitempty"`
}

// Err is the reply's error: an [*errdefs.RemoteError] of its class, nil
// for none.
func (r Reply) Err() error {
	if r.Class == "" {
		return nil
	}
	return &errdefs.RemoteError{Class: r.Class, Message: r.Error, Host: r.Host}
}

// DefaultTimeout bounds an operation whose request carries no timeout.
const DefaultTimeout = 5 * time.Minute

// Serve answers model-control requests for d on [Subject](lattice, host)
// over nc until the returned subscription is drained or unsubscribed;
// loads read the module's bytes from st. Requests are handled one at a
// time.
func Serve(nc *nats.Conn, lattice, host string, d *deploy.Deployment, st Store, log *slog.Logger) (*nats.Subscription, error) {
	if log == nil {
		log = slog.Default()
	}
	return nc.Subscribe(Subject(lattice, host), func(msg *nats.Msg) {
		var req Request
		var rep Reply
		if err := json.Unmarshal(msg.Data, &req); err != nil {
			rep = errReply(errdefs.Errorf(errdefs.ErrInvalidArgument, "model control: the request is not JSON: %v", err))
		} else {
			timeout := req.Timeout
			if timeout <= 0 {
				timeout = DefaultTimeout
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			rep = handle(ctx, d, st, req, log)
			cancel()
		}
		rep.Host = host
		if rep.Class != "" {
			log.Info("model control refused", "op", req.Op, "class", rep.Class, "err", rep.Error)
		}
		b, err := json.Marshal(rep)
		if err != nil {
			b, _ = json.Marshal(Reply{Host: host, Class: errdefs.ClassInternal, Error: err.Error()})
		}
		if err := msg.Respond(b); err != nil {
			log.Warn("model control: answering", "op", req.Op, "err", err)
		}
	})
}

func errReply(err error) Reply {
	return Reply{Class: deploy.Class(err), Error: err.Error()}
}

func handle(ctx context.Context, d *deploy.Deployment, st Store, req Request, log *slog.Logger) Reply {
	switch req.Op {
	case OpRestore:
		r := Restore(ctx, d, st, log)
		return Reply{Restored: &r}
	case OpModules:
		return Reply{Modules: d.Modules()}
	case OpLoad:
		if req.Module == nil {
			return errReply(errdefs.Errorf(errdefs.ErrInvalidArgument, "model control: load needs a module"))
		}
		bin, err := st.Blob(ctx, req.Module.SHA256)
		if err != nil {
			return errReply(err)
		}
		source := req.Source
		if source == "" {
			source = "upload"
		}
		info, created, err := d.LoadModule(ctx, *req.Module, bin, source)
		if err != nil {
			return errReply(err)
		}
		return Reply{Module: &info, Created: created}
	case OpUnload:
		gone, err := d.UnloadModule(ctx, req.Ref)
		if err != nil && gone == nil {
			return errReply(err)
		}
		return Reply{Unloaded: gone}
	case OpSwap:
		res, err := d.SwapSession(ctx, req.Session, req.Stage)
		if err != nil {
			return errReply(err)
		}
		return Reply{Swap: &res, ManifestStage: ManifestStage(d, req.Session)}
	case OpReset:
		res, err := d.ResetSession(ctx, req.Session)
		rep := Reply{}
		if res.Session != "" {
			rep.Reset = &res
		}
		if err != nil {
			e := errReply(err)
			rep.Class, rep.Error = e.Class, e.Error
		}
		return rep
	}
	return errReply(errdefs.Errorf(errdefs.ErrInvalidArgument, "model control: unknown op %q", req.Op))
}

// Call sends req to host's endpoint over nc and returns its reply, within
// ctx (its deadline is passed on as the request's Timeout). A host that
// does not answer is an error of class unavailable.
func Call(ctx context.Context, nc *nats.Conn, lattice, host string, req Request) (Reply, error) {
	if dl, ok := ctx.Deadline(); ok {
		req.Timeout = time.Until(dl)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
		req.Timeout = DefaultTimeout
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	msg, err := nc.RequestWithContext(ctx, Subject(lattice, host), b)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return Reply{}, &errdefs.RemoteError{Class: errdefs.ClassDeadlineExceeded, Host: host,
				Message: fmt.Sprintf("host %s did not answer %s within the deadline", host, req.Op)}
		}
		return Reply{}, &errdefs.RemoteError{Class: errdefs.ClassUnavailable, Host: host,
			Message: fmt.Sprintf("host %s cannot be reached for %s: %v", host, req.Op, err)}
	}
	var rep Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return Reply{}, &errdefs.RemoteError{Class: errdefs.ClassInternal, Host: host,
			Message: fmt.Sprintf("host %s answered %s with no reply: %v", host, req.Op, err)}
	}
	return rep, nil
}
