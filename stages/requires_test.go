package stages_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/stages"
)

// customSection encodes a custom section (names and payloads under 128
// bytes: one-byte lengths).
func customSection(name, payload string) []byte {
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, payload...)
	return append([]byte{0, byte(len(body))}, body...)
}

// TestRequiresSection: SetRequires writes the section (replacing the
// module's), ReadRequires and Validate read it; a malformed one, or a
// second one, is refused at validation, naming it.
func TestRequiresSection(t *testing.T) {
	bin, err := os.ReadFile("testdata/hostile/echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stages.ReadRequires(bin); r != nil || err != nil {
		t.Fatalf("a module without the section: %v %v", r, err)
	}
	one, err := stages.SetRequires(bin, &abi.Requires{Version: 1, Programs: []string{"fill"}})
	if err != nil {
		t.Fatal(err)
	}
	two, err := stages.SetRequires(one, &abi.Requires{Version: 1, Streams: []string{"s1"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := stages.ReadRequires(two)
	if err != nil || len(r.Programs) != 0 || len(r.Streams) != 1 || len(two) > len(one)+8 {
		t.Fatalf("set over a section: %+v %v (%d bytes, then %d)", r, err, len(one), len(two))
	}
	if err := stages.Validate(two, stages.NewLoadConfig().WithName("echo")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bin  []byte
		want string
	}{
		{append(append([]byte{}, bin...), customSection(abi.RequiresSection, `{"version":1,"programs":[1]}`)...), `stagehost.requires: programs: a JSON number where a string is wanted`},
		{append(append([]byte{}, two...), customSection(abi.RequiresSection, `{"version":1}`)...), `a second stagehost.requires section`},
	} {
		_, err := stages.ReadRequires(tc.bin)
		verr := stages.Validate(tc.bin, stages.NewLoadConfig().WithName("echo"))
		if err == nil || verr == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(verr.Error(), tc.want) || !errors.Is(verr, errdefs.ErrInvalidArgument) {
			t.Errorf("read: %v; validate: %v; want %q", err, verr, tc.want)
		}
	}
	if _, err := stages.SetRequires(bin, &abi.Requires{Version: 2}); err == nil {
		t.Error("SetRequires wrote a document the host refuses")
	}
}

func ExampleSetRequires() {
	bin, _ := os.ReadFile("testdata/hostile/echo.wasm")
	out, err := stages.SetRequires(bin, &abi.Requires{Version: abi.RequiresVersion, Programs: []string{"matmul"},
		Inputs:  []abi.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{-1, 4}}},
		Outputs: []abi.TensorSpec{{Name: "y", Datatype: "FP32", Shape: []int64{-1, 4}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	r, _ := stages.ReadRequires(out)
	fmt.Println(r.Programs, r.Inputs[0].Name, r.Inputs[0].Shape)
	// Output: [matmul] x [-1 4]
}
