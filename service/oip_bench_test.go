package service_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/service"
)

// BenchmarkRequestPathOIP: the Open Inference Protocol's overhead. The
// same 256-byte input (64 FP32, shape [16, 4]) to the echo stage, in
// process through the service's handler (no network): as the raw body
// of /v1/sessions/{name}/run, as JSON tensors to /v2/models/{name}/infer
// (the answer JSON too), and as binary tensor data (the answer binary
// too). p50-µs is the median request's latency.
func BenchmarkRequestPathOIP(b *testing.B) {
	path, sum := echoWith(b, &abi.Requires{Inputs: []abi.TensorSpec{tensor("x", "FP32", -1, 4)}, Outputs: []abi.TensorSpec{tensor("y", "FP32", -1, 4)}})
	d := open(b, strings.NewReplacer("@P@", path, "@S@", sum).Replace(`
version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "echo"
path = "@P@"
sha256 = "@S@"
[[session]]
name = "echo"
stage = "echo"
device = "gpu0"
`))
	h := service.NewServer(d, slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))).Handler()
	vals := make([]float32, 64)
	raw := make([]byte, 0, 256)
	for i := range vals {
		vals[i] = float32(i)*0.37 - 5
		raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(vals[i]))
	}
	js, _ := json.Marshal(vals)
	jsonBody := []byte(`{"id":"bench","inputs":[{"name":"x","shape":[16,4],"datatype":"FP32","data":` + string(js) + `}]}`)
	head := []byte(`{"id":"bench","parameters":{"binary_data_output":true},"inputs":[{"name":"x","shape":[16,4],"datatype":"FP32","parameters":{"binary_data_size":256}}]}`)
	binBody := append(append([]byte{}, head...), raw...)
	for _, bc := range []struct {
		name, path string
		body       []byte
		header     [2]string
		check      func(*httptest.ResponseRecorder) bool
	}{
		{"v1-run", "/v1/sessions/echo/run", raw, [2]string{"Content-Type", "application/octet-stream"},
			func(rec *httptest.ResponseRecorder) bool { return bytes.Equal(rec.Body.Bytes(), raw) }},
		{"v2-infer-json", "/v2/models/echo/infer", jsonBody, [2]string{"Content-Type", "application/json"},
			func(rec *httptest.ResponseRecorder) bool { return bytes.Contains(rec.Body.Bytes(), js[1:len(js)-1]) }},
		{"v2-infer-binary", "/v2/models/echo/infer", binBody, [2]string{service.InferHeaderLength, strconv.Itoa(len(head))},
			func(rec *httptest.ResponseRecorder) bool { return bytes.HasSuffix(rec.Body.Bytes(), raw) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				req := httptest.NewRequest(http.MethodPost, bc.path, bytes.NewReader(bc.body))
				req.Header.Set(bc.header[0], bc.header[1])
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				lat = append(lat, time.Since(t0))
				if rec.Code != 200 || !bc.check(rec) {
					b.Fatalf("%d %.200s", rec.Code, rec.Body)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		})
	}
}
