package net_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/examples/wasm/digits/net"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

// reference is ../reference.json, written by ../train.py: the held-out
// test set through NumPy's float32 forward pass.
type reference struct {
	WeightsSHA256 string      `json:"weights_sha256"`
	Indices       []int       `json:"indices"`
	Count         int         `json:"count"`
	Correct       int         `json:"correct"`
	Accuracy      float64     `json:"accuracy"`
	Labels        []int       `json:"labels"`
	Predictions   []int       `json:"predictions"`
	Inputs        [][]float32 `json:"inputs"`
	Logits        [][]float32 `json:"logits"`
	Probabilities [][]float32 `json:"probabilities"`
}

func readReference(t testing.TB) *reference {
	t.Helper()
	b, err := os.ReadFile("../reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var r reference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Count != 360 || len(r.Inputs) != r.Count || len(r.Labels) != r.Count || len(r.Predictions) != r.Count ||
		len(r.Probabilities) != r.Count || len(r.Logits) != r.Count {
		t.Fatalf("reference.json: %d images, %d inputs, %d labels, %d predictions, %d probability rows",
			r.Count, len(r.Inputs), len(r.Labels), len(r.Predictions), len(r.Probabilities))
	}
	for i := range r.Count {
		if len(r.Inputs[i]) != net.Pixels || len(r.Probabilities[i]) != net.Classes {
			t.Fatalf("reference.json image %d: %d inputs, %d probabilities", i, len(r.Inputs[i]), len(r.Probabilities[i]))
		}
	}
	return &r
}

// images is the input of a call for images [from, to) of the test set.
func (r *reference) images(from, to int) []byte {
	var in []byte
	for _, x := range r.Inputs[from:to] {
		in = append(in, stagehost.Float32Bytes(x)...)
	}
	return in
}

// argmax is the first index of the largest value, as NumPy's argmax.
func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// SimBound is the largest difference allowed between a probability from
// the simulator and reference.json's, relative to the reference: the
// logits are bit-identical (conv2d, relu, maxpool2d, gemm and add are in
// the exact tier and train.py's float32 pass follows their order), and the
// simulator's softmax, like train.py's, is float64 rounded once to
// float32: at most 1 ulp apart (|got−ref| ≤ 2^-23·|ref| + 2^-149).
var SimBound = math.Ldexp(1, -23)

// CUDABound is the same on CUDA, whose softmax is within 4 ulp +
// (cols/256 + 16)·2^-24 of the float64 result (docs/kernels.md), plus the
// reference's own rounding: |got−ref| ≤ 5·2^-23·|ref| + 16·2^-24.
var CUDABound = [2]float64{5 * math.Ldexp(1, -23), 16 * math.Ldexp(1, -24)}

// compare checks the probabilities of images [0, len(out)/ResultSize)
// against the reference: the predictions image for image, the accuracy,
// and every probability within rel·|ref| + abs. It returns the number of
// predictions that differ.
func compare(t *testing.T, r *reference, out []byte, rel, abs float64) (mismatches int) {
	t.Helper()
	n := len(out) / net.ResultSize
	if len(out) != n*net.ResultSize {
		t.Fatalf("output of %d bytes is not a whole number of results", len(out))
	}
	got := stagehost.Float32s(out)
	correct, worst, inexact, outside := 0, 0.0, 0, 0
	for i := range n {
		p := got[i*net.Classes : (i+1)*net.Classes]
		if pred := argmax(p); pred != r.Predictions[i] {
			mismatches++
			t.Errorf("image %d (digits index %d): predicted %d, reference %d", i, r.Indices[i], pred, r.Predictions[i])
		} else if pred == r.Labels[i] {
			correct++
		}
		for j, g := range p {
			want := float64(r.Probabilities[i][j])
			d := math.Abs(float64(g) - want)
			if d != 0 {
				inexact++
			}
			if want != 0 {
				worst = max(worst, d/math.Abs(want))
			}
			if !(d <= rel*math.Abs(want)+abs) {
				if outside++; outside <= 10 {
					t.Errorf("image %d class %d: probability %g, reference %g", i, j, g, want)
				}
			}
		}
	}
	if outside > 10 {
		t.Errorf("%d probabilities in all outside the bound", outside)
	}
	if n == r.Count && correct != r.Correct {
		t.Errorf("%d of %d correct, reference %d", correct, n, r.Correct)
	}
	t.Logf("%d images: %d predictions differ from the reference; %d correct (%.2f%%); %d of %d probabilities not bit-identical, largest relative difference %.3g",
		n, mismatches, correct, 100*float64(correct)/float64(n), inexact, n*net.Classes, worst)
	return mismatches
}

// quiet is the service's logger in these tests: requests are not logged.
var quiet = slog.New(slog.DiscardHandler)

// serve opens the manifest at path and returns a function that posts a
// body to /v1/sessions/digits/run.
func serve(t *testing.T, path string) func(body []byte) *httptest.ResponseRecorder {
	t.Helper()
	do := handler(t, path)
	return func(body []byte) *httptest.ResponseRecorder { return do("POST", "/v1/sessions/digits/run", body) }
}

// openDeployment loads the manifest at path and opens it, its compile
// cache in a temporary directory (the test leaves no compiled module
// behind); the deployment is closed when t ends.
func openDeployment(t testing.TB, path string) (*deploy.Deployment, *manifest.Manifest) {
	t.Helper()
	m, err := manifest.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m.Runtime.CacheDir = t.TempDir()
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d, m
}

// handler opens the manifest at path and returns a function that sends a
// request to its service.
func handler(t *testing.T, path string) func(method, target string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	d, m := openDeployment(t, path)
	h := service.NewServerConfig(d, quiet, service.ConfigFromManifest(m)).Handler()
	return func(method, target string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, bytes.NewReader(body))
		req = req.WithContext(testutil.Context(t, 2*time.Minute))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
}

// TestDigitsGoGuestMatchesReferenceThroughTheService: digits.toml on the
// simulator, served over /v1/sessions/digits/run, classifies the whole
// held-out test set (one request of 360 images) prediction for prediction
// as train.py's NumPy float32 forward pass, with its accuracy, and every
// probability within SimBound; a single image gives the same bytes as its
// row of the batch.
func TestDigitsGoGuestMatchesReferenceThroughTheService(t *testing.T) {
	testutil.GoGuests(t)
	r := readReference(t)
	do := handler(t, "../digits.toml")
	post := func(body []byte) *httptest.ResponseRecorder { return do("POST", "/v1/sessions/digits/run", body) }
	rec := post(r.images(0, r.Count))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	out := rec.Body.Bytes()
	if n := compare(t, r, out, SimBound, math.Ldexp(1, -149)); n != 0 {
		t.Fatalf("%d of %d predictions differ from the reference", n, r.Count)
	}
	// The same through the Open Inference Protocol, in JSON: the same bits.
	rec = do("POST", "/v2/models/digits/infer", inferBody(t, r.Inputs))
	if rec.Code != http.StatusOK {
		t.Fatalf("/v2 infer: %d %s", rec.Code, rec.Body)
	}
	if got := inferProbabilities(t, rec.Body.Bytes(), r.Count); !bytes.Equal(got, out) {
		t.Errorf("/v2 infer's probabilities differ from /v1 run's")
	}
	for _, i := range []int{0, 7, r.Count - 1} {
		rec := post(r.images(i, i+1))
		if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), out[i*net.ResultSize:(i+1)*net.ResultSize]) {
			t.Errorf("image %d alone: %d % x, in the batch % x", i, rec.Code, rec.Body.Bytes(), out[i*net.ResultSize:(i+1)*net.ResultSize])
		}
	}
	if rec := post(make([]byte, net.ImageSize+4)); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "64 float32") {
		t.Errorf("an image and 4 bytes: %d %s", rec.Code, rec.Body)
	}
}

// TestDigitsGoGuestREADMEClient: README.md's curl example posts the first
// test image to /v2/models/digits/infer, and the answer it shows is the
// service's, byte for byte.
func TestDigitsGoGuestREADMEClient(t *testing.T) {
	testutil.GoGuests(t)
	r := readReference(t)
	readme, err := os.ReadFile("../../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^    curl -s -H 'Content-Type: application/json' http://127\\.0\\.0\\.1:8080/v2/models/digits/infer --data '(.*)'\n\n```json\n(.*)\n```\n").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no curl example of /v2/models/digits/infer followed by its answer in a json block")
	}
	var req struct {
		Inputs []struct {
			Data []float32 `json:"data"`
		} `json:"inputs"`
	}
	if err := json.Unmarshal(m[1], &req); err != nil || len(req.Inputs) != 1 || !slices.Equal(req.Inputs[0].Data, r.Inputs[0]) {
		t.Fatalf("README.md's request is not the first test image (digits index %d): %v", r.Indices[0], err)
	}
	do := handler(t, "../digits.toml")
	rec := do("POST", "/v2/models/digits/infer", m[1])
	if rec.Code != http.StatusOK || rec.Body.String() != string(m[2]) {
		t.Fatalf("the answer is\n%d %s\nREADME.md shows\n%s", rec.Code, rec.Body, m[2])
	}
}

// inferBody is an Open Inference Protocol request for images: the
// declared input "images", FP32, [N, 64], in JSON.
func inferBody(t testing.TB, images [][]float32) []byte {
	t.Helper()
	type input struct {
		Name     string      `json:"name"`
		Shape    []int       `json:"shape"`
		Datatype string      `json:"datatype"`
		Data     [][]float32 `json:"data"`
	}
	b, err := json.Marshal(map[string][]input{"inputs": {{"images", []int{len(images), net.Pixels}, "FP32", images}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// inferProbabilities reads the output "probabilities" of an infer answer
// for n images as little-endian float32 bytes, checking its shape.
func inferProbabilities(t testing.TB, body []byte, n int) []byte {
	t.Helper()
	var ans struct {
		ModelName string `json:"model_name"`
		Outputs   []struct {
			Name     string    `json:"name"`
			Datatype string    `json:"datatype"`
			Shape    []int     `json:"shape"`
			Data     []float32 `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if ans.ModelName != "digits" || len(ans.Outputs) != 1 {
		t.Fatalf("answer: %s", body)
	}
	o := ans.Outputs[0]
	if o.Name != "probabilities" || o.Datatype != "FP32" || !slices.Equal(o.Shape, []int{n, net.Classes}) || len(o.Data) != n*net.Classes {
		t.Fatalf("output %s %s %v with %d values, want probabilities FP32 [%d %d]", o.Name, o.Datatype, o.Shape, len(o.Data), n, net.Classes)
	}
	return stagehost.Float32Bytes(o.Data)
}

// TestDigitsGoGuestSimEqualsEmu: the committed module on the simulator
// (digits.toml, the weights uploaded by the host) and the same stage code
// on the SDK emulator (WithSafetensors) give the same bytes, for a batch
// of 8 images and for single images.
func TestDigitsGoGuestSimEqualsEmu(t *testing.T) {
	testutil.GoGuests(t)
	r := readReference(t)
	inputs := [][]byte{r.images(0, 8), r.images(3, 4), r.images(100, 101)}
	post := serve(t, "../digits.toml")
	var sim [][]byte
	for i, in := range inputs {
		rec := post(in)
		if rec.Code != http.StatusOK {
			t.Fatalf("sim, input %d: %d %s", i, rec.Code, rec.Body)
		}
		sim = append(sim, rec.Body.Bytes())
	}
	e := newEmu(t)
	for i, in := range inputs {
		got, err := e.Run("main", in)
		if err != nil {
			t.Fatalf("emu, input %d: %v", i, err)
		}
		if !bytes.Equal(got, sim[i]) {
			t.Errorf("input %d: sim and emu differ:\n% x\n% x", i, sim[i], got)
		}
	}
	compare(t, r, sim[0], SimBound, math.Ldexp(1, -149))
}

// newEmu is the stage on the emulator with digits.safetensors as the
// weights "digits".
func newEmu(t testing.TB) *emu.Emulator {
	t.Helper()
	file, err := os.ReadFile("../digits.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	e := emu.New(emu.NewConfig().WithSafetensors(net.WeightsName, file)).Stream("s0").Programs(net.Programs...)
	e.Stage("main", net.Run)
	return e
}

// TestBadInput: anything but 1 to MaxImages whole images is
// INVALID_ARGUMENT, and the message says what the stage takes.
func TestBadInput(t *testing.T) {
	e := newEmu(t)
	for _, n := range []int{0, 3, net.ImageSize - 1, net.ImageSize + 1, (net.MaxImages + 1) * net.ImageSize} {
		_, err := e.Run("main", make([]byte, n))
		var ce *emu.ClientError
		if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) || !strings.Contains(err.Error(), "64 float32") {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	if _, err := e.Run("main", make([]byte, net.MaxImages*net.ImageSize)); err != nil {
		t.Errorf("%d images: %v", net.MaxImages, err)
	}
}

// TestMissingWeights: a session that does not list the weights gets
// NOT_FOUND at its first call, and the stage names no tensor of its own.
func TestMissingWeights(t *testing.T) {
	r := readReference(t)
	e := emu.New(emu.NewConfig()).Stream("s0").Programs(net.Programs...)
	e.Stage("main", net.Run)
	_, err := e.Run("main", r.images(0, 1))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusNotFound) {
		t.Fatalf("without the weights: %v", err)
	}
}

// TestWrongTensorShape: weights whose tensor has another shape are
// INVALID_ARGUMENT, naming the tensor and both shapes.
func TestWrongTensorShape(t *testing.T) {
	r := readReference(t)
	// conv1.bias as [2, 4] instead of [8]: the same 32 bytes.
	file := safetensors(t, map[string][]int{"conv1.bias": {2, 4}})
	e := emu.New(emu.NewConfig().WithSafetensors(net.WeightsName, file)).Stream("s0").Programs(net.Programs...)
	e.Stage("main", net.Run)
	_, err := e.Run("main", r.images(0, 1))
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != int32(stagehost.StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "digits/conv1.bias is [2, 4] of dtype 0, want [8] float32") {
		t.Fatalf("conv1.bias [2, 4]: %v", err)
	}
}

// safetensors is digits.safetensors with the shapes of the named tensors
// replaced (same sizes).
func safetensors(t *testing.T, shapes map[string][]int) []byte {
	t.Helper()
	file, err := os.ReadFile("../digits.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(file)
	var header map[string]map[string]any
	if err := json.Unmarshal(file[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	for name, shape := range shapes {
		header[name]["shape"] = shape
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), file[8+n:]...)
}

// TestDigitsModuleRequirements: the committed module declares what
// package net needs (its stagehost.requires section, from
// stage/requires.toml): the programs, stream s0, the weights, ABI
// revision 3, a budget of WorkBytes, and the tensors images FP32 [-1, 64]
// and probabilities FP32 [-1, 10]; a session without the weights is
// refused where the manifest is read, naming them.
func TestDigitsModuleRequirements(t *testing.T) {
	bin, err := os.ReadFile("../stage/digits.wasm")
	if err != nil {
		t.Fatal(err)
	}
	req, err := stages.ReadRequires(bin)
	if err != nil || req == nil {
		t.Fatalf("requirements: %v %v", req, err)
	}
	if !slices.Equal(req.Programs, net.Programs) || !slices.Equal(req.Streams, []string{"s0"}) ||
		!slices.Equal(req.Weights, []string{net.WeightsName}) || req.ABIRevision != 3 || req.MinBudgetBytes != net.WorkBytes {
		t.Errorf("requirements %+v; net: programs %v, weights %s, WorkBytes %d", req, net.Programs, net.WeightsName, net.WorkBytes)
	}
	if len(req.Inputs) != 1 || fmt.Sprint(req.Inputs[0]) != fmt.Sprint(abi.TensorSpec{Name: "images", Datatype: "FP32", Shape: []int64{-1, net.Pixels}}) {
		t.Errorf("inputs %+v", req.Inputs)
	}
	if len(req.Outputs) != 1 || fmt.Sprint(req.Outputs[0]) != fmt.Sprint(abi.TensorSpec{Name: "probabilities", Datatype: "FP32", Shape: []int64{-1, net.Classes}}) {
		t.Errorf("outputs %+v", req.Outputs)
	}

	// digits.toml without the session's weights key, its paths absolute.
	src, err := os.ReadFile("../digits.toml")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	m := strings.Replace(string(src), "\nweights = [\"digits\"]", "\n", 1)
	for _, f := range []string{"stage/digits.wasm", "digits.safetensors", "sample.bin"} {
		m = strings.Replace(m, `"`+f+`"`, strconv.Quote(filepath.Join(abs, f)), 1)
	}
	path := filepath.Join(t.TempDir(), "digits.toml")
	if err := os.WriteFile(path, []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = manifest.Load(path)
	if err == nil || !strings.Contains(err.Error(), `module "digits" needs weights "digits": session "digits" lists no weights`) {
		t.Fatalf("a session without the weights: %v", err)
	}
}

// TestArtefacts: reference.json names the committed weights' sha256, which
// digits.safetensors.sha256 records and the manifests' [[weights]]
// declare; the manifests name the committed module's; the reference's own predictions, labels and accuracy agree.
func TestArtefacts(t *testing.T) {
	r := readReference(t)
	w, err := os.ReadFile("../digits.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(w)
	if got := hex.EncodeToString(sum[:]); got != r.WeightsSHA256 {
		t.Errorf("digits.safetensors sha256 %s, reference.json says %s", got, r.WeightsSHA256)
	}
	rec, err := os.ReadFile("../digits.safetensors.sha256")
	if err != nil {
		t.Fatal(err)
	}
	if want := r.WeightsSHA256 + "  digits.safetensors\n"; string(rec) != want {
		t.Errorf("digits.safetensors.sha256 is %q, want %q", rec, want)
	}
	correct := 0
	for i := range r.Count {
		if argmax(r.Probabilities[i]) != r.Predictions[i] {
			t.Errorf("reference image %d: prediction %d is not the argmax of its probabilities", i, r.Predictions[i])
		}
		if r.Predictions[i] == r.Labels[i] {
			correct++
		}
	}
	if correct != r.Correct || r.Accuracy != float64(correct)/float64(r.Count) {
		t.Errorf("reference: %d correct, says %d (accuracy %g)", correct, r.Correct, r.Accuracy)
	}
	bin, err := os.ReadFile("../stage/digits.wasm")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"../digits.toml", "../digits-cuda.toml"} {
		m, err := manifest.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		mod := m.Module("digits")
		if mod == nil || mod.SHA256 != hex.EncodeToString(sha256Of(bin)) {
			t.Errorf("%s: module digits %+v, the committed module's sha256 is %x", path, mod, sha256Of(bin))
		}
		if len(m.Weights) != 1 || m.Weights[0].Name != net.WeightsName || m.Weights[0].SHA256 != r.WeightsSHA256 {
			t.Errorf("%s: weights %+v, want %s with sha256 %s", path, m.Weights, net.WeightsName, r.WeightsSHA256)
		}
	}
}

func sha256Of(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// TestDigitsOnCUDA: digits-cuda.toml on cuda0, served, classifies the
// whole test set prediction for prediction as the reference, every
// probability within CUDABound, through /v1 run and /v2 infer alike. It skips without a usable GPU, unless
// STAGEHOST_REQUIRE_GPU=1.
func TestDigitsOnCUDA(t *testing.T) {
	p, err := cuda.Open(cuda.NewConfig())
	testutil.GPU(t, err)
	p.Close() // the manifest's deployment opens its own
	r := readReference(t)
	do := handler(t, "../digits-cuda.toml")
	rec := do("POST", "/v1/sessions/digits/run", r.images(0, r.Count))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	out := rec.Body.Bytes()
	if n := compare(t, r, out, CUDABound[0], CUDABound[1]); n != 0 {
		t.Fatalf("%d of %d predictions differ from the reference", n, r.Count)
	}
	rec = do("POST", "/v2/models/digits/infer", inferBody(t, r.Inputs))
	if rec.Code != http.StatusOK {
		t.Fatalf("/v2 infer: %d %s", rec.Code, rec.Body)
	}
	if got := inferProbabilities(t, rec.Body.Bytes(), r.Count); !bytes.Equal(got, out) {
		t.Errorf("/v2 infer's probabilities differ from /v1 run's")
	}
}

// BenchmarkDigitsService: one image per request through the service,
// over loopback HTTP (httptest.NewServer), on the simulator (digits.toml)
// and on cuda0 (digits-cuda.toml; skipped without a usable GPU): run is
// POST /v1/sessions/digits/run with the 256 raw bytes, infer is POST
// /v2/models/digits/infer with the image as JSON (the answer's 10
// probabilities as JSON). Besides ns/op it reports the p50 and p99
// request latency in µs.
//
//	go test -run '^$' -bench DigitsService -benchtime 2000x ./examples/wasm/digits/net
func BenchmarkDigitsService(b *testing.B) {
	r := readReference(b)
	for _, backend := range []struct{ name, manifest string }{{"sim", "../digits.toml"}, {"cuda", "../digits-cuda.toml"}} {
		b.Run(backend.name, func(b *testing.B) {
			if backend.name == "cuda" {
				p, err := cuda.Open(cuda.NewConfig())
				testutil.GPU(b, err)
				p.Close()
			}
			base := httpServe(b, backend.manifest)
			for _, route := range []struct{ name, path, ctype string }{
				{"run", "/v1/sessions/digits/run", "application/octet-stream"},
				{"infer", "/v2/models/digits/infer", "application/json"},
			} {
				body := r.images(0, 1)
				if route.name == "infer" {
					body = inferBody(b, r.Inputs[:1])
				}
				b.Run(route.name, func(b *testing.B) {
					post := func() time.Duration {
						start := time.Now()
						resp, err := http.Post(base+route.path, route.ctype, bytes.NewReader(body))
						if err != nil {
							b.Fatal(err)
						}
						out, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err != nil || resp.StatusCode != http.StatusOK || route.name == "run" && len(out) != net.ResultSize {
							b.Fatalf("%v %d %q", err, resp.StatusCode, out)
						}
						return time.Since(start)
					}
					for range 20 { // warm: the instance, the connection
						post()
					}
					lat := make([]time.Duration, 0, 1024)
					for b.Loop() {
						lat = append(lat, post())
					}
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				})
			}
		})
	}
}

// httpServe serves the manifest at path on a loopback listener and
// returns its base URL.
func httpServe(b *testing.B, path string) string {
	b.Helper()
	d, m := openDeployment(b, path)
	srv := httptest.NewServer(service.NewServerConfig(d, quiet, service.ConfigFromManifest(m)).Handler())
	b.Cleanup(srv.Close)
	return srv.URL
}
