package service_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

// echoWith writes echo.wasm (its output is its input) with a
// stagehost.requires section of r, and returns its path and sha256.
func echoWith(t testing.TB, r *abi.Requires) (string, string) {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join(repo, "stages/testdata/hostile/echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if r != nil {
		r.Version = abi.RequiresVersion
		if bin, err = stages.SetRequires(bin, r); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "echo.wasm")
	if err := os.WriteFile(path, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, stages.SHA256(bin)
}

func tensor(name, dt string, shape ...int64) abi.TensorSpec {
	return abi.TensorSpec{Name: name, Datatype: dt, Shape: shape}
}

// oipManifest's sessions: mymodel, the model of the protocol's examples
// (its outputs are its inputs, echoed); f32, a batch of rows of 4 FP32;
// raw, a module without tensors; short, a module that declares more
// output than it writes.
const oipManifest = `
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "mymodel"
path = "@MYMODEL@"
sha256 = "@MYMODELSHA@"
[[module]]
name = "f32"
path = "@F32@"
sha256 = "@F32SHA@"
[[module]]
name = "raw"
path = "@RAW@"
sha256 = "@RAWSHA@"
[[module]]
name = "short"
path = "@SHORT@"
sha256 = "@SHORTSHA@"
[[session]]
name = "mymodel"
stage = "mymodel"
device = "gpu0"
[[session]]
name = "f32"
stage = "f32"
device = "gpu0"
max_input = 1024
[[session]]
name = "raw"
stage = "raw"
device = "gpu0"
[[session]]
name = "short"
stage = "short"
device = "gpu0"
[[session]]
name = "tiny"
stage = "mymodel"
device = "gpu0"
max_input = "18B"
`

// openOIP serves oipManifest in-process; it returns the handler and
// mymodel's version.
func openOIP(t testing.TB) (http.Handler, string) {
	t.Helper()
	srv, version := openOIPServer(t)
	return srv.Handler(), version
}

func openOIPServer(t testing.TB) (*service.Server, string) {
	t.Helper()
	my, mySHA := echoWith(t, &abi.Requires{
		Inputs:  []abi.TensorSpec{tensor("input0", "UINT32", 2, 2), tensor("input1", "BOOL", 3)},
		Outputs: []abi.TensorSpec{tensor("output0", "UINT32", 2, 2), tensor("output1", "BOOL", 3)}})
	f32, f32SHA := echoWith(t, &abi.Requires{
		Inputs: []abi.TensorSpec{tensor("x", "FP32", -1, 4)}, Outputs: []abi.TensorSpec{tensor("y", "FP32", -1, 4)}})
	raw, rawSHA := echoWith(t, nil)
	short, shortSHA := echoWith(t, &abi.Requires{
		Inputs: []abi.TensorSpec{tensor("a", "UINT8", 4)}, Outputs: []abi.TensorSpec{tensor("b", "UINT8", 8)}})
	body := strings.NewReplacer("@MYMODEL@", my, "@MYMODELSHA@", mySHA, "@F32@", f32, "@F32SHA@", f32SHA,
		"@RAW@", raw, "@RAWSHA@", rawSHA, "@SHORT@", short, "@SHORTSHA@", shortSHA).Replace(oipManifest)
	d := open(t, body)
	return service.NewServer(d, nil), mySHA[:12]
}

type oipAnswer struct {
	status int
	header http.Header
	body   []byte
}

func do(h http.Handler, method, path string, body []byte, header ...string) oipAnswer {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return oipAnswer{rec.Code, rec.Header(), rec.Body.Bytes()}
}

func jsonOf(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	return v
}

func testdata(t *testing.T, name, version string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "oip", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(b, []byte("@VERSION@"), []byte(version))
}

// TestOIPInferJSONAsTheSpecExample: the inference request of the
// protocol's own example (testdata/oip/README.md) gets the example's
// response.
func TestOIPInferJSONAsTheSpecExample(t *testing.T) {
	h, version := openOIP(t)
	for _, path := range []string{"/v2/models/mymodel/infer", "/v2/models/mymodel/versions/1/infer", "/v2/models/mymodel/versions/" + version[:8] + "/infer"} {
		a := do(h, "POST", path, testdata(t, "required_api_request.json", version), "Content-Type", "application/json")
		if a.status != 200 || a.header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %s\n%s", path, a.status, a.header, a.body)
		}
		if got, want := jsonOf(t, a.body), jsonOf(t, testdata(t, "required_api_response.json", version)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\ngot  %s\nwant %s", path, a.body, testdata(t, "required_api_response.json", version))
		}
	}
}

// TestOIPInferBinaryAsTheSpecExample: the binary tensor data extension's
// example request, JSON then 19 bytes, gets its response: JSON then the
// output's 16 bytes, with Inference-Header-Content-Length.
func TestOIPInferBinaryAsTheSpecExample(t *testing.T) {
	h, version := openOIP(t)
	head := testdata(t, "binary_request.json", version)
	in0 := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 1), 2), 3), 4)
	body := append(append(append([]byte{}, head...), in0...), 1, 0, 1)
	a := do(h, "POST", "/v2/models/mymodel/infer", body, "Content-Type", "application/octet-stream", service.InferHeaderLength, strconv.Itoa(len(head)))
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	n, err := strconv.Atoi(a.header.Get(service.InferHeaderLength))
	if err != nil || n > len(a.body) || a.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("headers %v", a.header)
	}
	if got, want := jsonOf(t, a.body[:n]), jsonOf(t, testdata(t, "binary_response.json", version)); !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %s\nwant %s", a.body[:n], testdata(t, "binary_response.json", version))
	}
	if !bytes.Equal(a.body[n:], in0) {
		t.Fatalf("binary output %x, want %x", a.body[n:], in0)
	}
	// binary_data_output asks for every output as binary, JSON in.
	req := `{"parameters":{"binary_data_output":true},"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[[1,2],[3,4]]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,false,true]}]}`
	a = do(h, "POST", "/v2/models/mymodel/infer", []byte(req))
	n, _ = strconv.Atoi(a.header.Get(service.InferHeaderLength))
	if a.status != 200 || n == 0 || !bytes.Equal(a.body[n:], append(in0, 1, 0, 1)) {
		t.Fatalf("binary_data_output: %d %s", a.status, a.body)
	}
}

// TestOIPInferFreeDimension: a batch of any size: the output's free
// dimension is what its bytes make; FP32 values come back exactly.
func TestOIPInferFreeDimension(t *testing.T) {
	h, _ := openOIP(t)
	vals := []float32{0.5, -1.25, 3e-8, 1e30, 7, 8, 9, 10, 0, -0, 1.5, 2}
	js, _ := json.Marshal(vals)
	a := do(h, "POST", "/v2/models/f32/infer", []byte(`{"inputs":[{"name":"x","shape":[3,4],"datatype":"FP32","data":`+string(js)+`}]}`))
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	var resp struct {
		Outputs []struct {
			Name  string
			Shape []int64
			Data  []float32
		}
	}
	if err := json.Unmarshal(a.body, &resp); err != nil || len(resp.Outputs) != 1 || !reflect.DeepEqual(resp.Outputs[0].Shape, []int64{3, 4}) || !reflect.DeepEqual(resp.Outputs[0].Data, vals) {
		t.Fatalf("%v %s", err, a.body)
	}
}

// TestOIPValidation: each malformed request is a 400 whose JSON error
// (the protocol's {"error"} only) names the tensor and what is wrong;
// the stage never runs.
func TestOIPValidation(t *testing.T) {
	h, _ := openOIP(t)
	in0 := `{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[1,2,3,4]}`
	in1 := `{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,false,true]}`
	req := func(inputs ...string) string { return `{"inputs":[` + strings.Join(inputs, ",") + `]}` }
	for _, tc := range []struct {
		name, model, body, header, want string
	}{
		{"unknown input", "mymodel", req(in0, in1, `{"name":"input9","shape":[1],"datatype":"BOOL","data":[true]}`), "", `input "input9" is not an input of model "mymodel" (its inputs: "input0", "input1")`},
		{"missing input", "mymodel", req(in0), "", `input "input1" is missing`},
		{"input twice", "mymodel", req(in0, in1, in0), "", `input "input0" is given twice`},
		{"datatype mismatch", "mymodel", req(strings.Replace(in0, "UINT32", "INT32", 1), in1), "", `input "input0": datatype "INT32", the model declares UINT32`},
		{"rank mismatch", "mymodel", req(strings.Replace(in0, "[2,2]", "[4]", 1), in1), "", `input "input0": shape [4] has rank 1, the model declares [2, 2] (rank 2)`},
		{"shape mismatch", "mymodel", req(strings.Replace(in0, "[2,2]", "[2,3]", 1), in1), "", `input "input0": shape [2, 3]: dimension 1 is 3, the model declares [2, 2]`},
		{"data length", "mymodel", req(strings.Replace(in0, "[1,2,3,4]", "[1,2,3]", 1), in1), "", `input "input0": 3 values of data for shape [2, 2], which holds 4`},
		{"non-numeric data", "mymodel", req(strings.Replace(in0, "[1,2,3,4]", `[1,"two",3,4]`, 1), in1), "", `input "input0": data[1]: "two" is not a number`},
		{"fraction for an integer", "mymodel", req(strings.Replace(in0, "[1,2,3,4]", `[1,2.5,3,4]`, 1), in1), "", `input "input0": data[1]: 2.5 is not an integer of UINT32`},
		{"number for BOOL", "mymodel", req(in0, strings.Replace(in1, "true,false", "1,0", 1)), "", `input "input1": data[0]: 1 is not a boolean`},
		{"binary size mismatch", "mymodel", `{"inputs":[` + in0 + `,{"name":"input1","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":2}}]}` + "\x01\x00", "HEADER", `input "input1": binary_data_size 2, but shape [3] of BOOL is 3 bytes`},
		{"binary data left over", "mymodel", `{"inputs":[` + in0 + `,{"name":"input1","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}}]}` + "\x01\x00\x01\x01", "HEADER", `the binary data is 4 bytes, the inputs' binary_data_size sum to 3`},
		{"binary without the header", "mymodel", `{"inputs":[` + in0 + `,{"name":"input1","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}}]}`, "", `input "input1": binary_data_size without the Inference-Header-Content-Length header`},
		{"unknown output", "mymodel", `{"inputs":[` + in0 + `,` + in1 + `],"outputs":[{"name":"output7"}]}`, "", `output "output7" is not an output of model "mymodel"`},
		{"not JSON", "mymodel", `{"inputs":`, "", `the request is not an inference request's JSON`},
		{"no tensors declared", "raw", req(in0), "", `model "raw": its module declares no tensors (no inputs or outputs in its stagehost.requires section): use /v1/sessions/raw/run`},
		{"negative dimension", "f32", `{"inputs":[{"name":"x","shape":[-1,4],"datatype":"FP32","data":[]}]}`, "", `input "x": shape [-1, 4]: dimension 0 is negative`},
	} {
		body := []byte(tc.body)
		var hdr []string
		if tc.header == "HEADER" {
			hdr = []string{service.InferHeaderLength, strconv.Itoa(bytes.LastIndexByte(body, '}') + 1)}
		}
		a := do(h, "POST", "/v2/models/"+tc.model+"/infer", body, hdr...)
		var e map[string]any
		if err := json.Unmarshal(a.body, &e); err != nil || a.status != 400 || len(e) != 1 || !strings.Contains(e["error"].(string), tc.want) {
			t.Errorf("%s: %d %s\nwant 400 {\"error\": …%s…}", tc.name, a.status, a.body, tc.want)
		}
	}
}

// TestOIPErrors: an unknown model or version is 404, a stage output that
// does not fit the declared outputs 500 naming the output, an input
// over max_input 413: each with the protocol's error body.
func TestOIPErrors(t *testing.T) {
	h, _ := openOIP(t)
	big := make([]float32, 260)
	js, _ := json.Marshal(big)
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/v2/models/nobody/infer", `{}`, 404, `no session "nobody"`},
		{"GET", "/v2/models/nobody", ``, 404, `no model "nobody"`},
		{"GET", "/v2/models/mymodel/versions/2", ``, 404, `model "mymodel" has no version "2"`},
		{"POST", "/v2/models/mymodel/versions/deadbeef00/infer", `{}`, 404, `has no version "deadbeef00"`},
		{"POST", "/v2/models/short/infer", `{"inputs":[{"name":"a","shape":[4],"datatype":"UINT8","data":[1,2,3,4]}]}`, 500, `output "b": the stage's output of 4 bytes`},
		{"POST", "/v2/models/f32/infer", `{"inputs":[{"name":"x","shape":[65,4],"datatype":"FP32","data":` + string(js) + `}]}`, 413, `larger than session "f32"'s max_input of 1024 bytes`},
		{"DELETE", "/v2/models/mymodel", ``, 405, `not allowed`},
		// Each input fits, both together (16 + 3 bytes) do not.
		{"POST", "/v2/models/tiny/infer", `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[1,2,3,4]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,false,true]}]}`,
			413, `input "input1": shape [3] makes the stage's input larger than session "tiny"'s max_input of 18 bytes`},
	} {
		a := do(h, tc.method, tc.path, []byte(tc.body))
		var e map[string]any
		if err := json.Unmarshal(a.body, &e); err != nil || a.status != tc.status || len(e) != 1 || !strings.Contains(e["error"].(string), tc.want) {
			t.Errorf("%s %s: %d %s\nwant %d {\"error\": …%s…}", tc.method, tc.path, a.status, a.body, tc.status, tc.want)
		}
	}
	// /v1 keeps its own error body.
	a := do(h, "POST", "/v1/sessions/nobody/run", nil)
	if e := jsonOf(t, a.body).(map[string]any); a.status != 404 || e["class"] != "not_found" || e["request_id"] == nil {
		t.Errorf("/v1: %d %s", a.status, a.body)
	}
}

// TestOIPMetadata: the server's metadata, the model list, a model's
// metadata from its declared tensors, and its readiness.
func TestOIPMetadata(t *testing.T) {
	h, version := openOIP(t)
	a := do(h, "GET", "/v2", nil)
	if m := jsonOf(t, a.body).(map[string]any); a.status != 200 || m["name"] != "stagehost" || !reflect.DeepEqual(m["extensions"], []any{"binary_tensor_data"}) {
		t.Fatalf("/v2: %d %s", a.status, a.body)
	}
	a = do(h, "GET", "/v2/models/mymodel", nil)
	want := `{"name":"mymodel","versions":["` + version + `"],"platform":"stagehost",
	"inputs":[{"name":"input0","datatype":"UINT32","shape":[2,2]},{"name":"input1","datatype":"BOOL","shape":[3]}],
	"outputs":[{"name":"output0","datatype":"UINT32","shape":[2,2]},{"name":"output1","datatype":"BOOL","shape":[3]}]}`
	if a.status != 200 || !reflect.DeepEqual(jsonOf(t, a.body), jsonOf(t, []byte(want))) {
		t.Fatalf("metadata: %d %s", a.status, a.body)
	}
	if a = do(h, "GET", "/v2/models/mymodel/versions/"+version, nil); a.status != 200 {
		t.Fatalf("metadata of the version: %d %s", a.status, a.body)
	}
	a = do(h, "GET", "/v2/models/raw", nil)
	if m := jsonOf(t, a.body).(map[string]any); a.status != 200 || len(m["inputs"].([]any)) != 0 || len(m["outputs"].([]any)) != 0 {
		t.Fatalf("metadata of a module without tensors: %d %s", a.status, a.body)
	}
	a = do(h, "GET", "/v2/models", nil)
	var list struct {
		Models []struct {
			Name    string
			State   string
			Tensors bool
		}
	}
	if err := json.Unmarshal(a.body, &list); err != nil || len(list.Models) != 5 || list.Models[0].Name != "f32" || !list.Models[0].Tensors || list.Models[2].Name != "raw" || list.Models[2].Tensors {
		t.Fatalf("list: %v %s", err, a.body)
	}
	for _, p := range []string{"/v2/models/mymodel/ready", "/v2/models/mymodel/versions/1/ready"} {
		if a = do(h, "GET", p, nil); a.status != 200 || jsonOf(t, a.body).(map[string]any)["ready"] != true {
			t.Fatalf("%s: %d %s", p, a.status, a.body)
		}
	}
}

// TestUploadAndSwapRefuseUnmetRequirements: over HTTP, an upload of a
// new version of a session's module, and a swap to a module, that need
// what the session lacks are 409 failed_precondition, listing every
// missing item, and the session keeps serving.
func TestUploadAndSwapRefuseUnmetRequirements(t *testing.T) {
	h, _ := openOIP(t)
	needy, needySHA := echoWith(t, &abi.Requires{Programs: []string{"matmul", "softmax"}, Weights: []string{"digits"}})
	bin, err := os.ReadFile(needy)
	if err != nil {
		t.Fatal(err)
	}
	want := `module "raw" needs programs "matmul", "softmax" not listed by session "raw"; weights "digits": session "raw" lists no weights`
	a := do(h, "PUT", "/v1/modules/raw?sha256="+needySHA, bin)
	var e service.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil || a.status != 409 || e.Class != "failed_precondition" || !strings.Contains(e.Error, want) {
		t.Fatalf("upload: %d %s", a.status, a.body)
	}
	if a = do(h, "PUT", "/v1/modules/other?sha256="+needySHA, bin); a.status != 201 {
		t.Fatalf("upload under a name no session has: %d %s", a.status, a.body)
	}
	a = do(h, "POST", "/v1/sessions/raw/swap", []byte(`{"stage": "other"}`))
	if err := json.Unmarshal(a.body, &e); err != nil || a.status != 409 || e.Class != "failed_precondition" ||
		e.Error != `session "raw" keeps its module: module "other" needs programs "matmul", "softmax" not listed by session "raw"; weights "digits": session "raw" lists no weights` {
		t.Fatalf("swap: %d %s", a.status, a.body)
	}
	if a = do(h, "POST", "/v1/sessions/raw/run", []byte("still")); a.status != 200 || string(a.body) != "still" {
		t.Fatalf("after the refusals: %d %s", a.status, a.body)
	}
}

// TestOIPAuth: the /v2 routes need the invoke scope (the health routes
// none), and refuse with the protocol's error body.
func TestOIPAuth(t *testing.T) {
	const invoke = "invoke-token-0123456789"
	s := serveHostile(t, "", "", func(c *service.Config) { c.InvokeTokens = []string{invoke} })
	for _, path := range []string{"/v2", "/v2/models", "/v2/models/steady", "/v2/models/steady/ready"} {
		rec := s.do("GET", path, nil)
		var e map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" || len(e) != 1 || e["error"] == nil {
			t.Errorf("%s without a token: %d %s", path, rec.Code, rec.Body)
		}
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+invoke)
		rr := httptest.NewRecorder()
		s.srv.Handler().ServeHTTP(rr, req)
		if rr.Code != 200 {
			t.Errorf("%s with an invoke token: %d %s", path, rr.Code, rr.Body)
		}
	}
	if rec := s.do("GET", "/v2/health/live", nil); rec.Code != 200 {
		t.Errorf("health without a token: %d", rec.Code)
	}
}

// echoLattice routes every call, answering its input back, or answer.
type echoLattice struct {
	*fakeLattice
}

func (l echoLattice) Call(ctx context.Context, session string, input []byte) ([]byte, string, error) {
	if _, _, err := l.fakeLattice.Call(ctx, session, input); err != nil {
		return nil, "", err
	}
	return input, "", nil
}

// TestOIPInferThroughTheLattice: in a lattice an infer is routed as a
// run (the tensors those of this host's module); one for a session only
// another host has is 400; another host's error keeps its status, with
// the protocol's body.
func TestOIPInferThroughTheLattice(t *testing.T) {
	srv, version := openOIPServer(t)
	f := &fakeLattice{}
	srv.SetLattice(echoLattice{f})
	h := srv.Handler()
	a := do(h, "POST", "/v2/models/mymodel/infer", testdata(t, "required_api_request.json", version))
	if a.status != 200 || !reflect.DeepEqual(jsonOf(t, a.body), jsonOf(t, testdata(t, "required_api_response.json", version))) || len(f.calls) != 1 {
		t.Fatalf("routed: %d %s (calls %v)", a.status, a.body, f.calls)
	}
	a = do(h, "POST", "/v2/models/far/infer", []byte(`{"inputs":[]}`))
	if a.status != 400 || !strings.Contains(string(a.body), `model \"far\": its tensors are unknown on this host`) || len(f.calls) != 1 {
		t.Fatalf("another host's session: %d %s", a.status, a.body)
	}
	f.answer = &errdefs.RemoteError{Class: errdefs.ClassBusy, Message: "session \"mymodel\" is busy on host h2", Host: "h2"}
	a = do(h, "POST", "/v2/models/mymodel/infer", testdata(t, "required_api_request.json", version))
	var e map[string]any
	if err := json.Unmarshal(a.body, &e); err != nil || a.status != 429 || len(e) != 1 || e["error"] != `session "mymodel" is busy on host h2` {
		t.Fatalf("a remote error: %d %s", a.status, a.body)
	}
}

// TestOIPRawBinaryRequest: the binary extension's raw request
// (Inference-Header-Content-Length: 0, the body the one input's bytes)
// gets every output as binary; a model of two inputs refuses it.
func TestOIPRawBinaryRequest(t *testing.T) {
	h, _ := openOIP(t)
	raw := make([]byte, 4*8) // 2 rows of 4 FP32
	for i := range raw {
		raw[i] = byte(i)
	}
	a := do(h, "POST", "/v2/models/f32/infer", raw, "Content-Type", "application/octet-stream", service.InferHeaderLength, "0")
	n, _ := strconv.Atoi(a.header.Get(service.InferHeaderLength))
	if a.status != 200 || n == 0 || !bytes.Equal(a.body[n:], raw) || !strings.Contains(string(a.body[:n]), `"shape":[2,4],"parameters":{"binary_data_size":32}`) {
		t.Fatalf("raw: %d %s", a.status, a.body)
	}
	for _, tc := range []struct {
		model string
		body  []byte
		want  string
	}{
		{"f32", raw[:30], `input "x": a raw binary request of 30 bytes does not fit shape [-1, 4] of FP32 (16 bytes per free dimension's unit)`},
		{"mymodel", raw[:19], `a raw binary request (Inference-Header-Content-Length: 0) needs a model of one input; model "mymodel" has 2`},
	} {
		a := do(h, "POST", "/v2/models/"+tc.model+"/infer", tc.body, service.InferHeaderLength, "0")
		if a.status != 400 || !strings.Contains(string(a.body), strings.ReplaceAll(tc.want, `"`, `\"`)) {
			t.Errorf("%s: %d %s\nwant %s", tc.model, a.status, a.body, tc.want)
		}
	}
}
