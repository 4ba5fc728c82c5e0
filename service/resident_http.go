package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/stagehost/stagehost/errdefs"
)

// remoteResident answers POST /v1/residents/{name}/start (start) or GET
// /v1/residents/{name} for a resident this process does not have: through
// the lattice, when a live host of it has the resident (or one had it
// since this process joined), else 404. The host's JSON answer is written
// as the service writes its own (indented), with 202 for a start and 200
// for a status; its errors keep their class.
func (s *Server) remoteResident(w http.ResponseWriter, r *http.Request, start bool) {
	name := r.PathValue("name")
	l := s.latticeOf()
	if l == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no resident session %q", name))
		return
	}
	if !l.KnownResident(name) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "no resident session %q on this host or on any live host of its lattice", name))
		return
	}
	var out []byte
	var err error
	status := http.StatusOK
	if start {
		status = http.StatusAccepted
		out, err = l.StartResident(r.Context(), name)
	} else {
		out, err = l.ResidentStatus(r.Context(), name)
	}
	if err != nil {
		var ce *errdefs.RemoteError
		if errors.As(err, &ce) {
			s.writeClassError(w, r, ce, "")
			return
		}
		s.writeError(w, r, err)
		return
	}
	var body bytes.Buffer
	if err := json.Indent(&body, out, "", "  "); err != nil {
		s.writeError(w, r, &serviceError{errdefs.ClassInternal, "resident " + name + ": the lattice's answer is not JSON: " + err.Error()})
		return
	}
	body.WriteByte('\n') // as writeJSON's encoder ends its value
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body.Bytes())
}
