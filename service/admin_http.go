package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// The model-control routes, all of scope admin (docs/service.md, "Model
// control"):
//
//	GET    /v1/modules                   the loaded module versions
//	POST   /v1/modules                   load a file on the server's machine: JSON ModuleRequest; 201 (200 if already loaded)
//	PUT    /v1/modules/{name}?sha256=X   load the body's bytes (at most the module size limit); 201 (200 if already loaded)
//	DELETE /v1/modules/{ref}             unload name (every version) or name@sha256; 400 while a session uses it
//	POST   /v1/sessions/{name}/swap      {"stage": "name" or "name@sha256", "host_only", "timeout"}: swap with a drain (in a lattice: on every host, unless host_only)
//	POST   /v1/sessions/{name}/reset     replace the quarantined or failed instances by fresh ones
func (s *Server) adminRoutes() {
	s.route("GET /v1/modules", scopeAdmin, s.listModules)
	s.route("POST /v1/modules", scopeAdmin, s.loadModule)
	s.route("PUT /v1/modules/{name}", scopeAdmin, s.uploadModule)
	s.route("DELETE /v1/modules/{name}", scopeAdmin, s.unloadModule)
	s.route("POST /v1/sessions/{name}/swap", scopeAdmin, s.swapSession)
	s.route("POST /v1/sessions/{name}/reset", scopeAdmin, s.resetSession)
}

// maxAdminJSON bounds the JSON body of an admin request.
const maxAdminJSON = 64 << 10

// readJSON decodes r's JSON body into v (unknown fields refused).
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.Errorf(errdefs.ErrOutOfBudget, "the request body is larger than %d bytes", maxAdminJSON)
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "the request body is not the expected JSON: %v", err)
	}
	if dec.More() {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "the request body holds more than one JSON value")
	}
	return nil
}

func (s *Server) listModules(w http.ResponseWriter, r *http.Request) {
	if mc := s.modelControl(); mc != nil {
		body, err := mc.Modules(r.Context())
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, body)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"modules": s.d.Modules()})
}

// control is where model control acts: a ModelControl set with
// SetModelControl (a supervisor's workers), else the deployment.
func (s *Server) control() interface {
	LoadModule(ctx context.Context, req deploy.ModuleRequest, bin []byte, source string) (deploy.ModuleInfo, bool, error)
	UnloadModule(ctx context.Context, ref string) ([]deploy.ModuleInfo, error)
	SwapSession(ctx context.Context, name, ref string) (deploy.SwapResult, error)
	ResetSession(ctx context.Context, name string) (deploy.ResetResult, error)
	MaxModuleSize(name string) int64
} {
	if mc := s.modelControl(); mc != nil {
		return mc
	}
	return s.d
}

func (s *Server) answerLoad(w http.ResponseWriter, r *http.Request, info deploy.ModuleInfo, created bool, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, info)
}

func (s *Server) loadModule(w http.ResponseWriter, r *http.Request) {
	var req deploy.ModuleRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !deploy.ValidModuleName(req.Name) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "module name %q: want 1 to 64 of A-Z a-z 0-9 _ . -", req.Name))
		return
	}
	bin, err := s.d.ReadModuleFile(req.Name, req.Path)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info, created, err := s.control().LoadModule(r.Context(), req, bin, "path")
	s.answerLoad(w, r, info, created, err)
}

// uploadModule loads the request body. Its query gives the sha256 and,
// optionally, kind, memory_limit (bytes), snapshot (true or false) and
// wasi (a grant; repeated for several).
func (s *Server) uploadModule(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := deploy.ModuleRequest{Name: r.PathValue("name"), SHA256: q.Get("sha256"), Kind: q.Get("kind")}
	if !deploy.ValidModuleName(req.Name) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "module name %q: want 1 to 64 of A-Z a-z 0-9 _ . -", req.Name))
		return
	}
	if req.SHA256 == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "the sha256 query parameter is required (the hex sha256 of the body)"))
		return
	}
	if v := q.Get("memory_limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "memory_limit %q: want a number of bytes", v))
			return
		}
		req.MemoryLimit = &n
	}
	if v := q.Get("snapshot"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %q: want true or false", v))
			return
		}
		req.Snapshot = &b
	}
	if q.Has("wasi") {
		req.WASI = q["wasi"]
	}
	limit := s.control().MaxModuleSize(req.Name)
	if r.ContentLength > limit {
		refuseUnread(w, r)
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrOutOfBudget, "the module of %d bytes is larger than the module size limit of %d bytes", r.ContentLength, limit))
		return
	}
	bin, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrOutOfBudget, "the module is larger than the module size limit of %d bytes", limit))
			return
		}
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading the request body: %v", err))
		return
	}
	info, created, err := s.control().LoadModule(r.Context(), req, bin, "upload")
	s.answerLoad(w, r, info, created, err)
}

func (s *Server) unloadModule(w http.ResponseWriter, r *http.Request) {
	gone, err := s.control().UnloadModule(r.Context(), r.PathValue("name"))
	if err != nil && gone == nil {
		s.writeError(w, r, err)
		return
	}
	if err != nil { // unloaded, but closing it failed: logged, not the client's problem
		s.logger.Warn("closing an unloaded module", "module", r.PathValue("name"), "err", err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"unloaded": gone})
}

// SwapRequest is the body of POST /v1/sessions/{name}/swap.
type SwapRequest struct {
	Stage string `json:"stage"` // "name" (its newest version) or "name@sha256"
	// HostOnly, in a lattice, swaps the session on this host only
	// (without a lattice every swap is this host's).
	HostOnly bool `json:"host_only,omitempty"`
	// Timeout, in a lattice, bounds the wait for every host's
	// acknowledgement of a lattice-wide swap (a Go duration, "30s";
	// default 1m, lattice.DefaultSwapTimeout).
	Timeout string `json:"timeout,omitempty"`
}

func (s *Server) swapSession(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	mc := s.modelControl() // a supervisor's ModelControl answers for itself
	sw, _ := s.latticeOf().(latticeSwapper)
	if mc == nil && sw == nil && s.d.Pool(name) == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no session %q", name))
		return
	}
	var req SwapRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if strings.TrimSpace(req.Stage) == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, `the body needs "stage": a module name or name@sha256`))
		return
	}
	ctx := r.Context()
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "timeout %q: want a positive Go duration such as \"30s\"", req.Timeout))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if mc == nil && sw != nil {
		ans, err := sw.SwapSession(ctx, name, req.Stage, req.HostOnly)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, ans)
		return
	}
	res, err := s.control().SwapSession(ctx, name, req.Stage)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) resetSession(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	res, err := s.control().ResetSession(r.Context(), name)
	if err != nil && res.Session != "" {
		err = fmt.Errorf("%w (replaced %d, skipped %d)", err, len(res.Replaced), len(res.Skipped))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
