package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// The Open Inference Protocol (KServe v2, Triton's HTTP/REST API) over
// the sessions of this process: a model is a session, its version the
// sha256 of its current stage module, and its tensors the ones the
// module declares (its stagehost.requires section, abi/ABI.md §7). An
// infer call runs on the same guarded path as /v1/sessions/{name}/run
// (serveRun); only the body and the answer differ (oipCall).
// docs/service.md, "The Open Inference Protocol", is the contract.

// InferHeaderLength is the binary tensor data extension's header: the
// length of the JSON object at the start of a body that binary tensor
// data follows.
const InferHeaderLength = "Inference-Header-Content-Length"

// oipPlatform is every model's platform in the metadata.
const oipPlatform = "stagehost"

// oipVersionLen is how many hex digits of the module's sha256 a model's
// version has.
const oipVersionLen = 12

func (s *Server) oipRoutes() {
	s.route("GET /v2", scopeInvoke, s.oipServer)
	s.route("GET /v2/models", scopeInvoke, s.oipModels)
	s.route("GET /v2/models/{name}", scopeInvoke, s.oipModel)
	s.route("GET /v2/models/{name}/versions/{version}", scopeInvoke, s.oipModel)
	s.route("GET /v2/models/{name}/ready", scopeInvoke, s.oipModelReady)
	s.route("GET /v2/models/{name}/versions/{version}/ready", scopeInvoke, s.oipModelReady)
	for _, p := range []string{"POST /v2/models/{name}/infer", "POST /v2/models/{name}/versions/{version}/infer"} {
		s.route(p, scopeInvoke, s.oipInfer)
		s.limited[p] = true // under max_in_flight, as a run
	}
}

// isOIP reports whether r is a request of the protocol's routes, whose
// errors have the protocol's body.
func isOIP(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v2/") || r.URL.Path == "/v2"
}

// oipErrorBody is the protocol's error body: {"error": "…"} only.
type oipErrorBody struct {
	Error string `json:"error"`
}

// serverVersion is the module version of the binary, "devel" when built
// from a checkout.
var serverVersion = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}()

func (s *Server) oipServer(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"name": oipPlatform, "version": serverVersion, "extensions": []string{"binary_tensor_data"}})
}

// oipTensor is a tensor's metadata.
type oipTensor struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

func tensorsOf(specs []abi.TensorSpec) []oipTensor {
	out := make([]oipTensor, len(specs))
	for i, t := range specs {
		out[i] = oipTensor{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape}
	}
	return out
}

// oipModelEntry is a row of GET /v2/models.
type oipModelEntry struct {
	Name     string   `json:"name"`
	Versions []string `json:"versions"`
	Platform string   `json:"platform"`
	State    string   `json:"state"`            // the session's: ready, quarantined, failed
	Reason   string   `json:"reason,omitempty"` // why it is not ready
	Tensors  bool     `json:"tensors"`          // whether its module declares tensors (else infer is 400)
}

func versionOf(mod *stages.Module) string {
	if mod == nil {
		return ""
	}
	return mod.SHA256()[:oipVersionLen]
}

func versionsOf(mod *stages.Module) []string {
	if mod == nil {
		return []string{}
	}
	return []string{versionOf(mod)}
}

func (s *Server) oipModels(w http.ResponseWriter, _ *http.Request) {
	models := []oipModelEntry{}
	for _, st := range s.d.Statuses() {
		p := s.d.Pool(st.Name)
		if p == nil {
			continue
		}
		mod := p.Module()
		e := oipModelEntry{Name: st.Name, Versions: versionsOf(mod), Platform: oipPlatform, State: st.State, Reason: st.Reason}
		if mod != nil {
			if r := mod.Requires(); r != nil {
				e.Tensors = len(r.Inputs)+len(r.Outputs) > 0
			}
		}
		models = append(models, e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// oipPool returns the session a model route names, and its current
// module, checking the version in the path: "1" or a prefix of at least
// 8 hex digits of the module's sha256.
func (s *Server) oipPool(r *http.Request) (*deploy.Pool, *stages.Module, error) {
	name := r.PathValue("name")
	p := s.d.Pool(name)
	if p == nil {
		return nil, nil, errdefs.Errorf(errdefs.ErrNotFound, "no model %q: a model is a session of this host (GET /v2/models lists them)", name)
	}
	mod := p.Module()
	if err := checkVersion(name, r.PathValue("version"), mod); err != nil {
		return nil, nil, err
	}
	return p, mod, nil
}

func checkVersion(name, v string, mod *stages.Module) error {
	if v == "" || v == "1" {
		return nil
	}
	if mod == nil {
		return errdefs.Errorf(errdefs.ErrNotFound, "model %q has no version %q: its module is not loaded", name, v)
	}
	if len(v) < 8 || !strings.HasPrefix(mod.SHA256(), strings.ToLower(v)) {
		return errdefs.Errorf(errdefs.ErrNotFound, "model %q has no version %q: its version is %s (or \"1\"; a prefix of at least 8 hex digits of its module's sha256 will do)", name, v, versionOf(mod))
	}
	return nil
}

func (s *Server) oipModel(w http.ResponseWriter, r *http.Request) {
	p, mod, err := s.oipPool(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	md := map[string]any{"name": p.Spec.Name, "versions": versionsOf(mod), "platform": oipPlatform, "inputs": []oipTensor{}, "outputs": []oipTensor{}}
	if mod != nil {
		if req := mod.Requires(); req != nil {
			md["inputs"], md["outputs"] = tensorsOf(req.Inputs), tensorsOf(req.Outputs)
		}
	}
	writeJSON(w, http.StatusOK, md)
}

func (s *Server) oipModelReady(w http.ResponseWriter, r *http.Request) {
	if _, _, err := s.oipPool(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.sessionReady(w, r) // the same answer as /v1/sessions/{name}/ready
}

func (s *Server) oipInfer(w http.ResponseWriter, r *http.Request) {
	s.serveRun(w, r, &oipCall{})
}

// --- the infer call's body and answer ---

// oipRequest is $inference_request.
type oipRequest struct {
	ID         string          `json:"id"`
	Parameters map[string]any  `json:"parameters"`
	Inputs     []oipInput      `json:"inputs"`
	Outputs    []oipOutputWant `json:"outputs"`
}

// oipInput is $request_input.
type oipInput struct {
	Name       string          `json:"name"`
	Shape      []int64         `json:"shape"`
	Datatype   string          `json:"datatype"`
	Parameters map[string]any  `json:"parameters"`
	Data       json.RawMessage `json:"data"`
}

// oipOutputWant is $request_output.
type oipOutputWant struct {
	Name       string         `json:"name"`
	Parameters map[string]any `json:"parameters"`
}

// oipCall is an infer call's runCodec: the request it read, for the
// answer.
type oipCall struct {
	session string
	version string
	req     oipRequest
	decl    *abi.Requires
}

// oipBodyLimit is the largest infer body for a session of max_input
// maxInput: JSON numbers take more bytes than their values.
func oipBodyLimit(maxInput int64) int64 {
	if maxInput > (math.MaxInt64-1<<20)/8 {
		return math.MaxInt64
	}
	return 8*maxInput + 1<<20
}

func (c *oipCall) bodyLimit(_ string, maxInput int64) (int64, string) {
	return oipBodyLimit(maxInput), "the session's infer body limit (8 × max_input + 1MiB)"
}

// boolParam reads a boolean parameter; absent is false.
func boolParam(what string, params map[string]any, key string) (bool, error) {
	v, ok := params[key]
	if !ok {
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, oipErrorf("%s: parameter %s is %v, not a boolean", what, key, v)
	}
	return b, nil
}

// inputName names an input in an error.
type inputName string

func (n inputName) String() string { return fmt.Sprintf("input %q", string(n)) }

// sizeParam reads input's binary_data_size: -1 when absent.
func sizeParam(input string, params map[string]any) (int64, error) {
	v, ok := params["binary_data_size"]
	if !ok {
		return -1, nil
	}
	f, ok := v.(float64)
	if !ok || f < 0 || f != math.Trunc(f) || f > 1<<53 {
		return 0, oipErrorf("input %q: parameter binary_data_size is %v, not a size in bytes", input, v)
	}
	return int64(f), nil
}

func (c *oipCall) input(r *http.Request, session string, mod *stages.Module, maxInput int64, body []byte) ([]byte, error) {
	c.session = session
	if mod == nil {
		return nil, oipErrorf("model %q: its tensors are unknown on this host (the session is another host's); call a host that has it, or /v1/sessions/%s/run", session, session)
	}
	if err := checkVersion(session, r.PathValue("version"), mod); err != nil {
		return nil, err
	}
	c.version = versionOf(mod)
	c.decl = mod.Requires()
	if c.decl == nil || len(c.decl.Inputs)+len(c.decl.Outputs) == 0 {
		return nil, oipErrorf("model %q: its module declares no tensors (no inputs or outputs in its %s section): use /v1/sessions/%s/run with the raw input bytes", session, abi.RequiresSection, session)
	}
	if len(c.decl.Outputs) == 0 {
		return nil, oipErrorf("model %q: its module declares no outputs: use /v1/sessions/%s/run", session, session)
	}
	head, bin := body, []byte(nil)
	if v := r.Header.Get(InferHeaderLength); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > int64(len(body)) {
			return nil, oipErrorf("%s: %q is not a length within the body of %d bytes", InferHeaderLength, v, len(body))
		}
		head, bin = body[:n], body[n:]
		if n == 0 {
			return c.rawBinary(session, maxInput, body)
		}
	}
	// The fast reader (oipscan.go) first; encoding/json, whose answer
	// stands, for what it does not read.
	if !scanInferRequest(head, &c.req) {
		c.req = oipRequest{}
		if err := json.Unmarshal(head, &c.req); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return nil, oipErrorf("the request's %s: a JSON %s where %s is wanted", te.Field, te.Value, te.Type)
			}
			return nil, oipErrorf("the request is not an inference request's JSON: %v", err)
		}
	}
	if _, err := boolParam("the request", c.req.Parameters, "binary_data_output"); err != nil {
		return nil, err
	}
	// Requested outputs: declared, each once.
	for i, o := range c.req.Outputs {
		if declared(c.decl.Outputs, o.Name) < 0 {
			return nil, oipErrorf("output %q is not an output of model %q (its outputs: %s)", o.Name, session, names(c.decl.Outputs))
		}
		for _, p := range c.req.Outputs[:i] {
			if p.Name == o.Name {
				return nil, oipErrorf("output %q is requested twice", o.Name)
			}
		}
		if v, ok := o.Parameters["binary_data"]; ok {
			if _, isBool := v.(bool); !isBool {
				return nil, oipErrorf("output %q: parameter binary_data is %v, not a boolean", o.Name, v)
			}
		}
	}
	// Inputs: each declared one exactly once, then in declaration order.
	byDecl := make([]int, len(c.decl.Inputs))
	for i := range byDecl {
		byDecl[i] = -1
	}
	for i, in := range c.req.Inputs {
		k := declared(c.decl.Inputs, in.Name)
		if k < 0 {
			return nil, oipErrorf("input %q is not an input of model %q (its inputs: %s)", in.Name, session, names(c.decl.Inputs))
		}
		if byDecl[k] >= 0 {
			return nil, oipErrorf("input %q is given twice", in.Name)
		}
		byDecl[k] = i
	}
	for k, i := range byDecl {
		if i < 0 {
			return nil, oipErrorf("input %q is missing (model %q's inputs: %s)", c.decl.Inputs[k].Name, session, names(c.decl.Inputs))
		}
	}
	// Binary data is taken in the order of the request's inputs.
	binOff := make([]int64, len(c.req.Inputs))
	var binUsed int64
	for i, in := range c.req.Inputs {
		n, err := sizeParam(in.Name, in.Parameters)
		if err != nil {
			return nil, err
		}
		binOff[i] = -1
		if n < 0 {
			continue
		}
		if r.Header.Get(InferHeaderLength) == "" {
			return nil, oipErrorf("input %q: binary_data_size without the %s header", in.Name, InferHeaderLength)
		}
		if len(in.Data) > 0 && string(in.Data) != "null" {
			return nil, oipErrorf("input %q: both data and binary_data_size", in.Name)
		}
		if binUsed+n > int64(len(bin)) {
			return nil, oipErrorf("input %q: binary_data_size %d passes the end of the binary data (%d bytes after the JSON, %d taken by the inputs before it)", in.Name, n, len(bin), binUsed)
		}
		binOff[i] = binUsed
		binUsed += n
	}
	if binUsed != int64(len(bin)) {
		return nil, oipErrorf("the binary data is %d bytes, the inputs' binary_data_size sum to %d", len(bin), binUsed)
	}
	input := make([]byte, 0, 256)
	for k, d := range c.decl.Inputs {
		in := c.req.Inputs[byDecl[k]]
		what := inputName(in.Name)
		if in.Datatype != d.Datatype {
			return nil, oipErrorf("%s: datatype %q, the model declares %s", what, in.Datatype, d.Datatype)
		}
		if in.Shape == nil {
			return nil, oipErrorf("%s: no shape (the model declares %s)", what, shapeString(d.Shape))
		}
		if err := checkShape(what, in.Shape, d.Shape); err != nil {
			return nil, err
		}
		size, ok := tensorBytes(d.Datatype, in.Shape, maxInput)
		if !ok || int64(len(input))+size > maxInput {
			return nil, errdefs.Errorf(errdefs.ErrOutOfBudget, "%s: shape %s makes the stage's input larger than %s of %d bytes", what, shapeString(in.Shape), maxInputName(session), maxInput)
		}
		if off := binOff[byDecl[k]]; off >= 0 {
			n, _ := sizeParam(in.Name, in.Parameters)
			if n != size {
				return nil, oipErrorf("%s: binary_data_size %d, but shape %s of %s is %d bytes", what, n, shapeString(in.Shape), d.Datatype, size)
			}
			input = append(input, bin[off:off+n]...)
			continue
		}
		if len(in.Data) == 0 || string(in.Data) == "null" {
			return nil, oipErrorf("%s: no data (and no binary_data_size)", what)
		}
		var count int
		var err error
		input, count, err = appendJSONData(input, what, in.Data, d.Datatype)
		if err != nil {
			return nil, err
		}
		if want := size / int64(abi.DatatypeSize(d.Datatype)); int64(count) != want {
			return nil, oipErrorf("%s: %d values of data for shape %s, which holds %d", what, count, shapeString(in.Shape), want)
		}
	}
	return input, nil
}

// rawBinary reads a raw binary request (the binary tensor data
// extension's: Inference-Header-Content-Length 0, the body the bytes of
// the model's one input): the input's free dimension, if it has one, is
// what the bytes make; every output is answered binary.
func (c *oipCall) rawBinary(session string, maxInput int64, body []byte) ([]byte, error) {
	if len(c.decl.Inputs) != 1 {
		return nil, oipErrorf("a raw binary request (%s: 0) needs a model of one input; model %q has %d (%s)", InferHeaderLength, session, len(c.decl.Inputs), names(c.decl.Inputs))
	}
	d := c.decl.Inputs[0]
	unit, frees := int64(abi.DatatypeSize(d.Datatype)), 0
	for _, dim := range d.Shape {
		if dim < 0 {
			frees++
		} else {
			unit *= dim
		}
	}
	per := "tensor"
	if frees == 1 {
		per = "free dimension's unit"
	}
	switch {
	case frees > 1:
		return nil, oipErrorf("input %q: a raw binary request needs an input of at most one free dimension; it is %s", d.Name, shapeString(d.Shape))
	case int64(len(body)) > maxInput:
		return nil, errdefs.Errorf(errdefs.ErrOutOfBudget, "input %q: %d bytes, larger than %s of %d bytes", d.Name, len(body), maxInputName(session), maxInput)
	case frees == 0 && int64(len(body)) != unit, frees == 1 && (unit == 0 || int64(len(body))%unit != 0):
		return nil, oipErrorf("input %q: a raw binary request of %d bytes does not fit shape %s of %s (%d bytes per %s)", d.Name, len(body), shapeString(d.Shape), d.Datatype, unit, per)
	}
	c.req = oipRequest{Parameters: map[string]any{"binary_data_output": true}}
	return body, nil
}

func declared(specs []abi.TensorSpec, name string) int {
	for i, t := range specs {
		if t.Name == name {
			return i
		}
	}
	return -1
}

func names(specs []abi.TensorSpec) string {
	q := make([]string, len(specs))
	for i, t := range specs {
		q[i] = strconv.Quote(t.Name)
	}
	if len(q) == 0 {
		return "none"
	}
	return strings.Join(q, ", ")
}

func (c *oipCall) answer(w http.ResponseWriter, out []byte) error {
	shapes, offs, err := splitOutputs(out, c.decl.Outputs)
	if err != nil {
		return err
	}
	binaryAll, _ := boolParam("", c.req.Parameters, "binary_data_output")
	// The outputs to answer: those requested, in their order, else every
	// declared one.
	type pick struct {
		k      int
		binary bool
	}
	picks := make([]pick, 0, 8)
	if len(c.req.Outputs) == 0 {
		for k := range c.decl.Outputs {
			picks = append(picks, pick{k, binaryAll})
		}
	} else {
		for _, o := range c.req.Outputs {
			b := binaryAll
			if _, ok := o.Parameters["binary_data"]; ok {
				b, _ = boolParam("", o.Parameters, "binary_data")
			}
			picks = append(picks, pick{declared(c.decl.Outputs, o.Name), b})
		}
	}
	js := make([]byte, 0, 128+8*len(out))
	js = append(js, `{"model_name":`...)
	js = appendJSONString(js, c.session)
	js = append(js, `,"model_version":`...)
	js = appendJSONString(js, c.version)
	if c.req.ID != "" {
		js = append(js, `,"id":`...)
		js = appendJSONString(js, c.req.ID)
	}
	js = append(js, `,"outputs":[`...)
	var tail [][]byte
	for i, p := range picks {
		t := c.decl.Outputs[p.k]
		data := out[offs[p.k]:offs[p.k+1]]
		if i > 0 {
			js = append(js, ',')
		}
		js = append(js, `{"name":`...)
		js = appendJSONString(js, t.Name)
		js = append(js, `,"datatype":"`...)
		js = append(js, t.Datatype...)
		js = append(js, `","shape":[`...)
		for j, d := range shapes[p.k] {
			if j > 0 {
				js = append(js, ',')
			}
			js = strconv.AppendInt(js, d, 10)
		}
		js = append(js, ']')
		if p.binary {
			js = append(js, `,"parameters":{"binary_data_size":`...)
			js = strconv.AppendInt(js, int64(len(data)), 10)
			js = append(js, '}', '}')
			tail = append(tail, data)
			continue
		}
		js = append(js, `,"data":`...)
		js = appendJSONValues(js, data, t.Datatype)
		js = append(js, '}')
	}
	js = append(js, ']', '}')
	if len(tail) == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(js)))
		_, _ = w.Write(js)
		return nil
	}
	total := len(js)
	for _, t := range tail {
		total += len(t)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(InferHeaderLength, strconv.Itoa(len(js)))
	w.Header().Set("Content-Length", strconv.Itoa(total))
	_, _ = w.Write(js)
	for _, t := range tail {
		_, _ = w.Write(t)
	}
	return nil
}

// appendJSONString appends s as a JSON string: as it is when it is
// printable ASCII without a quote or a backslash, else as encoding/json
// writes it.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
