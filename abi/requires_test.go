package abi_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
)

func TestParseRequiresAcceptsAFullDocument(t *testing.T) {
	doc := `{"version":1,"abi_revision":2,"programs":["matmul","softmax"],"streams":["s0"],"weights":["digits"],
	"min_budget_bytes":1048576,"wasi":true,
	"inputs":[{"name":"input0","datatype":"FP32","shape":[-1,784]}],
	"outputs":[{"name":"output0","datatype":"FP32","shape":[-1,10]},{"name":"class","datatype":"INT32","shape":[]}]}`
	r, err := abi.ParseRequires([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if r.ABIRevision != 2 || len(r.Programs) != 2 || r.WASI[0] != "go-runtime" || r.Inputs[0].Shape[0] != -1 || len(r.Outputs[1].Shape) != 0 {
		t.Fatalf("%+v", r)
	}
	again, err := abi.ParseRequires(r.Marshal())
	if err != nil || string(again.Marshal()) != string(r.Marshal()) {
		t.Fatalf("round trip: %v %s", err, again.Marshal())
	}
}

// TestParseRequiresRefuses: each malformed document is refused, the
// error naming the field.
func TestParseRequiresRefuses(t *testing.T) {
	many := `"` + strings.Repeat(`a","`, 1024) + `b"`
	for _, tc := range []struct{ doc, want string }{
		{`{}`, "version: required key is missing"},
		{`{"version":2}`, "version 2: this host reads version 1 only"},
		{`{"version":1,"extra":1}`, `unknown key "extra"`},
		{`{"version":1} {}`, "data after the JSON object"},
		{`{"version":1,`, "not JSON"},
		{`[1]`, "a JSON array where"},
		{`{"version":1,"programs":"matmul"}`, "programs: a JSON string where a list is wanted"},
		{`{"version":1,"programs":["a",""]}`, `programs[1]: "": want`},
		{`{"version":1,"programs":["a","a"]}`, `programs[1]: "a" is listed twice`},
		{`{"version":1,"streams":["s 0"]}`, `streams[0]: "s 0": want`},
		{`{"version":1,"weights":["Digits"]}`, `weights[0]: "Digits": want 1 to 64 of a-z`},
		{`{"version":1,"abi_revision":-1}`, "abi_revision -1"},
		{`{"version":1,"min_budget_bytes":-5}`, "min_budget_bytes -5"},
		{`{"version":1,"wasi":"yes"}`, "wasi: want true, false or a list"},
		{`{"version":1,"wasi":["path_open"]}`, `wasi[0]: "path_open": want "go-runtime"`},
		{`{"version":1,"inputs":[{"name":"x","datatype":"FLOAT","shape":[1]}]}`, `inputs[0].datatype: "FLOAT": want one of`},
		{`{"version":1,"inputs":[{"name":"x","datatype":"BYTES","shape":[1]}]}`, `inputs[0].datatype: "BYTES"`},
		{`{"version":1,"inputs":[{"name":"x","datatype":"FP32"}]}`, `inputs[0].shape: required key is missing`},
		{`{"version":1,"outputs":[{"name":"x","datatype":"FP32","shape":[-2]}]}`, `outputs[0].shape[0]: -2`},
		{`{"version":1,"outputs":[{"name":"x","datatype":"FP32","shape":[1,1,1,1,1,1,1,1,1]}]}`, `outputs[0].shape: rank 9, more than 8`},
		{`{"version":1,"outputs":[{"name":"x","datatype":"FP32","shape":[1]},{"name":"x","datatype":"FP32","shape":[1]}]}`, `outputs[1].name: "x" is declared twice`},
		{`{"version":1,"inputs":[{"name":"","datatype":"FP32","shape":[1]}]}`, `inputs[0].name: ""`},
		{`{"version":1,"programs":[` + many + `]}`, "programs: more than 1024 items in all"},
		{`{"version":1,"programs":["` + strings.Repeat("a", 70000) + `"]}`, "more than the limit of 65536"},
	} {
		_, err := abi.ParseRequires([]byte(tc.doc))
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.60s: %v, want an invalid_argument error with %q", tc.doc, err, tc.want)
		}
	}
}

// TestCheckListsEveryMissingItem: one error names every item the offer
// lacks, of class failed_precondition.
func TestCheckListsEveryMissingItem(t *testing.T) {
	r := &abi.Requires{Version: 1, ABIRevision: abi.Revision + 1, Programs: []string{"fill", "matmul", "softmax"},
		Streams: []string{"s0", "s1"}, Weights: []string{"digits"}, MinBudgetBytes: 2 << 20, WASI: []string{"fd_write"}}
	err := r.Check("mlp", abi.Offer{Session: "classify", Programs: []string{"fill", "saxpy"}, Streams: []string{"s0"}, Budget: 1 << 20})
	want := fmt.Sprintf(`module "mlp" needs programs "matmul", "softmax" not listed by session "classify"; streams "s1" not listed by session "classify"; `+
		`weights "digits": session "classify" lists no weights; min_budget_bytes 2097152, more than session "classify"'s budget of 1048576; `+
		`WASI grants "fd_write" the module is not loaded with (manifest wasi, or admin --wasi); ABI revision %d, the host has %d`, abi.Revision+1, abi.Revision)
	if err == nil || err.Error() != want || !errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.Name(err) != errdefs.ClassFailedPrecondition {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	err = r.Check("mlp", abi.Offer{Session: "classify", Weights: []string{"other"}, Programs: r.Programs, Streams: r.Streams, Budget: 2 << 20, WASI: []string{"go-runtime"}, Revision: abi.Revision + 1})
	if err == nil || err.Error() != `module "mlp" needs weights "digits" not listed by session "classify"` {
		t.Fatalf("%v", err)
	}
	ok := abi.Offer{Session: "classify", Weights: []string{"digits"}, Programs: r.Programs, Streams: r.Streams, Budget: 2 << 20, WASI: []string{"fd_write"}, Revision: abi.Revision + 1}
	if err := r.Check("mlp", ok); err != nil {
		t.Fatal(err)
	}
	// Without a session only the host's revision and the grants count.
	if err := r.Check("mlp", abi.Offer{WASI: []string{"go-runtime"}, Revision: abi.Revision + 1}); err != nil {
		t.Fatal(err)
	}
	if err := (*abi.Requires)(nil).Check("mlp", abi.Offer{Session: "s"}); err != nil {
		t.Fatal(err)
	}
	goRT := &abi.Requires{Version: 1, WASI: []string{"go-runtime"}}
	if err := goRT.Check("g", abi.Offer{WASI: []string{"fd_write"}}); err == nil {
		t.Fatal("go-runtime is granted by fd_write alone")
	}
}

func FuzzParseRequires(f *testing.F) {
	f.Add([]byte(`{"version":1,"programs":["fill"],"inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}]}`))
	f.Add([]byte(`{"version":1,"wasi":["fd_write"],"weights":["w"],"min_budget_bytes":7}`))
	f.Add([]byte(`{"version":1,"wasi":true}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		r, err := abi.ParseRequires(doc)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), abi.RequiresSection+": ") {
				t.Fatalf("error %v", err)
			}
			return
		}
		// What was accepted reads back the same.
		again, err := abi.ParseRequires(r.Marshal())
		if err != nil || string(again.Marshal()) != string(r.Marshal()) {
			t.Fatalf("round trip of %s: %v", r.Marshal(), err)
		}
	})
}

func ExampleParseRequires() {
	r, err := abi.ParseRequires([]byte(`{"version": 1, "programs": ["matmul"], "weights": ["digits"],
		"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 784]}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Programs, r.Inputs[0].Name, r.Inputs[0].Shape)
	fmt.Println(r.Check("classify", abi.Offer{Session: "classify", Programs: []string{"fill", "saxpy"}}))
	// Output:
	// [matmul] pixels [-1 784]
	// module "classify" needs programs "matmul" not listed by session "classify"; weights "digits": session "classify" lists no weights
}
