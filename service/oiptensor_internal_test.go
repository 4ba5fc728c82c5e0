package service

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
)

// TestHalfConversions: FP16 and BF16 round to nearest, ties to even, and
// read back what they hold.
func TestHalfConversions(t *testing.T) {
	for _, tc := range []struct {
		f float32
		h uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {0.5, 0x3800},
		{float32(math.Inf(1)), 0x7c00}, {70000, 0x7c00}, // overflow to infinity
		{5.960464477539063e-08, 0x0001}, // the smallest subnormal
		{1 + 1.0/2048, 0x3c00},          // a tie: to even (down)
		{1 + 3.0/2048, 0x3c02},          // a tie: to even (up)
	} {
		if got := f32ToF16(tc.f); got != tc.h {
			t.Errorf("f32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.h)
		}
		if exact := tc.f <= 65504 && tc.h != 0x3c00 && tc.h != 0x3c02; exact && f16ToF32(tc.h) != tc.f {
			t.Errorf("f16ToF32(%#04x) = %g, want %g", tc.h, f16ToF32(tc.h), tc.f)
		}
	}
	if !math.IsNaN(float64(f16ToF32(f32ToF16(float32(math.NaN()))))) {
		t.Error("NaN is not kept")
	}
	if got := f32ToBF16(1 + 1.0/256); got != 0x3f80 { // a tie: to even (down)
		t.Errorf("bf16 tie: %#04x", got)
	}
	if got := f32ToBF16(3.140625); got != 0x4049 {
		t.Errorf("bf16(3.140625) = %#04x", got)
	}
}

// TestSplitOutputs: fixed outputs take their size, the one free
// dimension the rest; anything else is a 500 naming the output.
func TestSplitOutputs(t *testing.T) {
	decl := []abi.TensorSpec{{Name: "class", Datatype: "INT32", Shape: []int64{}}, {Name: "scores", Datatype: "FP32", Shape: []int64{-1, 2}}}
	shapes, offs, err := splitOutputs(make([]byte, 4+4*6), decl)
	if err != nil || len(shapes[1]) != 2 || shapes[1][0] != 3 || offs[1] != 4 || offs[2] != 28 {
		t.Fatalf("%v %v %v", shapes, offs, err)
	}
	for _, tc := range []struct {
		n    int
		decl []abi.TensorSpec
		want string
	}{
		{4 + 4*5, decl, `output "scores": the stage's output of 24 bytes leaves 20 bytes for it, not a multiple of 8`},
		{8, decl[:1], `output "class": the stage's output of 8 bytes has 4 bytes after it`},
		{2, decl[:1], `output "class": the stage's output of 2 bytes has 2 left for it, which needs 4`},
		{8, []abi.TensorSpec{decl[1], {Name: "more", Datatype: "FP32", Shape: []int64{-1}}}, `output "more": the declared outputs have more than one free dimension`},
	} {
		if _, _, err := splitOutputs(make([]byte, tc.n), tc.decl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d bytes: %v, want %q", tc.n, err, tc.want)
		}
	}
}

// TestJSONValuesRoundTrip: every datatype's bytes written as JSON read
// back to the same bytes.
func TestJSONValuesRoundTrip(t *testing.T) {
	for _, dt := range abi.Datatypes {
		size := abi.DatatypeSize(dt)
		b := make([]byte, 3*size)
		for i := range b {
			b[i] = byte(i*37 + 1)
		}
		switch dt {
		case "BOOL":
			b = []byte{1, 0, 1}
		case "FP32", "FP64", "FP16", "BF16":
			b = appendJSONValuesInverse(t, dt)
		}
		js := appendJSONValues(nil, b, dt)
		back, n, err := appendJSONData(nil, "x", js, dt)
		if err != nil || n != 3 || string(back) != string(b) {
			t.Errorf("%s: %s → %x (%d values, %v), want %x", dt, js, back, n, err, b)
		}
	}
}

// appendJSONValuesInverse gives three finite values of a float type.
func appendJSONValuesInverse(t *testing.T, dt string) []byte {
	t.Helper()
	b, _, err := appendJSONData(nil, "x", []byte("[1.5, -0.25, 3]"), dt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzScanInferRequest: what the fast reader reads, encoding/json reads
// the same.
func FuzzScanInferRequest(f *testing.F) {
	f.Add([]byte(`{"id":"42","inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[1,2,3,4]}],"outputs":[{"name":"output0"}]}`))
	f.Add([]byte(`{"parameters":{"binary_data_output":true,"x":1.5,"s":"t"},"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}`))
	f.Add([]byte(`{"model_name":"m","extra":[{"a":null}],"inputs":[{"name":"x","data":[[1e3,-0.5],[2,3]],"shape":[2,2],"datatype":"FP32"}]}`))
	f.Add([]byte(`{"Inputs":[],"id":"\u0041"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast oipRequest
		if !scanInferRequest(b, &fast) {
			return
		}
		var slow oipRequest
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatalf("the fast reader read what encoding/json refuses (%v): %s", err, b)
		}
		norm := func(r *oipRequest) {
			if len(r.Inputs) == 0 {
				r.Inputs = nil
			}
			if len(r.Outputs) == 0 {
				r.Outputs = nil
			}
			for i := range r.Inputs {
				if len(r.Inputs[i].Shape) == 0 && r.Inputs[i].Shape != nil {
					r.Inputs[i].Shape = []int64{}
				}
				if len(r.Inputs[i].Data) == 0 {
					r.Inputs[i].Data = nil
				}
			}
		}
		norm(&fast)
		norm(&slow)
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%s:\nfast %#v\nslow %#v", b, fast, slow)
		}
	})
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"mymodel", "", `a"b\c`, "tab\there", "ünï", "\x00\xff", "<&>"} {
		var back string
		if err := json.Unmarshal(appendJSONString(nil, s), &back); err != nil || back != strings.ToValidUTF8(s, "\ufffd") {
			t.Errorf("%q: %s → %q %v", s, appendJSONString(nil, s), back, err)
		}
	}
}
