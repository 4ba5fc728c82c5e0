package abi

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// The Rust SDK (guest-sdk/rust) against this package: its imports, its
// status codes and its revision. Like the C header's checks, these read
// its sources.

func readRust(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile("../guest-sdk/rust/src/" + file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rustWasmType maps a Rust parameter type to its wasm32 type.
func rustWasmType(ty string) (api.ValueType, bool) {
	ty = strings.TrimSpace(ty)
	switch {
	case strings.HasPrefix(ty, "*"), ty == "u32", ty == "i32":
		return api.ValueTypeI32, true // a pointer is 32 bits on wasm32
	case ty == "u64", ty == "i64":
		return api.ValueTypeI64, true
	}
	return 0, false
}

// TestRustSDKFunctions: the Rust SDK's extern block imports from
// ImportModule exactly the host functions of its revision (every function
// of revision ≤ stagehost::REVISION), each with the ABI's signature and
// an i32 status; its revision is this ABI's [Revision], so a function a
// later revision adds must be added to the SDK too, and its constants for
// tensor_get's record are the ABI's.
func TestRustSDKFunctions(t *testing.T) {
	src := readRust(t, "sys.rs")
	if !strings.Contains(src, `#[link(wasm_import_module = "`+ImportModule+`")]`) {
		t.Fatalf("sys.rs: the extern block does not import from %s", ImportModule)
	}
	m := regexp.MustCompile(`pub const REVISION: u32 = (\d+);`).FindStringSubmatch(readRust(t, "lib.rs"))
	if m == nil {
		t.Fatal("lib.rs: no REVISION")
	}
	rev, _ := strconv.Atoi(m[1])
	if rev != Revision {
		t.Errorf("stagehost::REVISION = %d, this ABI is at revision %d: add the functions of the later revisions to sys.rs", rev, Revision)
	}
	if rev < 1 || rev > Revision {
		t.Fatalf("stagehost::REVISION = %d, this ABI has revisions 1 to %d", rev, Revision)
	}
	lib := readRust(t, "lib.rs")
	for name, want := range map[string]int{"TENSOR_RECORD_SIZE": TensorRecordSize, "MAX_TENSOR_RANK": MaxTensorRank} {
		if !strings.Contains(lib, "pub const "+name+": usize = "+strconv.Itoa(want)+";") {
			t.Errorf("lib.rs: %s is not %d", name, want)
		}
	}
	re := regexp.MustCompile(`(?m)^\s*pub fn (\w+)\(([^)]*)\) -> (\w+);`)
	block := src[strings.Index(src, "extern \"C\" {"):]
	block = block[:strings.Index(block, "\n    }\n")]
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(block, -1) {
		name, params, result := m[1], m[2], m[3]
		seen[name] = true
		sig, ok := Functions[name]
		if !ok {
			t.Errorf("sys.rs imports %s, which ABI v1 does not define", name)
			continue
		}
		if added := AddedIn[name]; added > rev {
			t.Errorf("sys.rs imports %s of revision %d, but stagehost::REVISION is %d", name, added, rev)
		}
		if result != "i32" {
			t.Errorf("sys.rs: %s returns %s", name, result)
		}
		var got []api.ValueType
		for _, p := range strings.Split(params, ",") {
			_, ty, ok := strings.Cut(p, ":")
			vt, ok2 := rustWasmType(ty)
			if !ok || !ok2 {
				t.Errorf("sys.rs: %s: cannot map parameter %q", name, p)
			}
			got = append(got, vt)
		}
		if !slices.Equal(got, sig.Params) {
			t.Errorf("sys.rs declares %s as %s, ABI %s", name, sigString(got, nil), sigString(sig.Params, nil))
		}
	}
	for name := range Functions {
		added := max(AddedIn[name], 1)
		if !seen[name] && added <= rev {
			t.Errorf("sys.rs does not import host function %s (revision %d)", name, added)
		}
	}
	if !strings.Contains(readRust(t, "lib.rs"), `pub extern "C" fn `+Marker+`() {}`) {
		t.Errorf("lib.rs: stage! does not export %s", Marker)
	}
}

// TestRustSDKStatusCodes: stagehost::Code maps every status of ABI v1 to
// its number and its name (ABI.md §5).
func TestRustSDKStatusCodes(t *testing.T) {
	src := readRust(t, "status.rs")
	for s := StatusOK; s < numStatus; s++ {
		num := regexp.MustCompile(`(?m)^\s*` + strconv.Itoa(int(s)) + ` => Code::(\w+),`).FindStringSubmatch(src)
		if num == nil {
			t.Errorf("status.rs: from_i32 does not map %d", s)
			continue
		}
		if !strings.Contains(src, "Code::"+num[1]+` => "`+s.String()+`",`) {
			t.Errorf("status.rs: Code::%s (%d) is not named %s", num[1], s, s.String())
		}
		if !strings.Contains(src, "Code::"+num[1]+" => "+strconv.Itoa(int(s))+",") {
			t.Errorf("status.rs: Code::%s is not %d as_i32", num[1], s)
		}
	}
}
