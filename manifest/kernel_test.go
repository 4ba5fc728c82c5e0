package manifest

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const kernelManifest = `version = 1

[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"

[[module]]
name = "good"
path = "modules/good_stage.wasm"
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"

[[kernel]]
name = "double"
%KERNEL%

[[session]]
name = "s"
stage = "good"
device = "gpu0"
budget = "64KiB"
programs = ["fill", "double"]
`

const goodKernel = `ptx = "kernels/double.ptx"
ptx_sha256 = "ebd4d2b5ac52fd7c2e6737638ecb7420a56f3be093050ddbdf1ec7eaaef04ada"
wasm = "kernels/double.wasm"
wasm_sha256 = "943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"
entry = "double"
args = [ { name = "x", kind = "buffer", dtype = "f32", dir = "in" },
         { name = "y", kind = "buffer", dtype = "f32", dir = "out" },
         { name = "n", kind = "u32" } ]`

func kernelToml(kernel string) []byte {
	return []byte(strings.ReplaceAll(kernelManifest, "%KERNEL%", kernel))
}

func TestKernel(t *testing.T) {
	m, err := Decode(filepath.Join("testdata", "host.toml"), kernelToml(goodKernel), nil)
	if err != nil {
		t.Fatal(err)
	}
	k := m.KernelNamed("double")
	if k == nil || k.Entry != "double" || k.JITTimeout != 30*time.Second || len(k.Args) != 3 || k.Tenant != "" ||
		k.WasmFile != filepath.Join("testdata", "kernels", "double.wasm") || k.PTXSHA256 != "ebd4d2b5ac52fd7c2e6737638ecb7420a56f3be093050ddbdf1ec7eaaef04ada" {
		t.Fatalf("kernel = %+v", k)
	}
	if k.MaxLocalMemory != 1<<30 || k.VendorLimits().MaxLocalMemory != 1<<30 {
		t.Fatalf("max_local_memory %d, limits %+v", k.MaxLocalMemory, k.VendorLimits())
	}
	for _, row := range []struct {
		value string
		want  int64
	}{{`"64MiB"`, 64 << 20}, {`0`, 0}, {`"2GiB"`, 2 << 30}, {`4096`, 4096}} {
		m, err := Decode(filepath.Join("testdata", "host.toml"), kernelToml(goodKernel+"\nmax_local_memory = "+row.value), nil)
		if err != nil {
			t.Fatalf("max_local_memory = %s: %v", row.value, err)
		}
		if got := m.KernelNamed("double").MaxLocalMemory; got != row.want {
			t.Fatalf("max_local_memory = %s: %d, want %d", row.value, got, row.want)
		}
	}
	if a := k.Args[2]; a.Kind != "u32" || a.Dir != "in" || a.DType != "" {
		t.Fatalf("arg n = %+v", a)
	}
	if s := k.Spec(); len(s.Args) != 3 || s.Args[0].Kind != "buffer" || s.Args[2].Kind != "scalar" || s.Args[2].Type != "u32" {
		t.Fatalf("spec = %+v", s)
	}
}

// TestKernelErrors: each row's [[kernel]] body gives exactly its errors,
// each naming the line and key.
func TestKernelErrors(t *testing.T) {
	replace := func(old, new string) string { return strings.Replace(goodKernel, old, new, 1) }
	for _, row := range []struct {
		name, kernel string
		want         []string
	}{
		{"no files", `entry = "double"
args = []`, []string{`:13: kernel[0]: a kernel needs ptx (for cuda devices) or wasm (for sim and cpu devices), or both`,
			`:23: session[0].programs[1]: kernel "double" has no wasm`}},
		{"sha256 mismatch", replace("943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad", "043488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"),
			[]string{`host.toml:18: kernel[0].wasm_sha256: does not match "testdata/kernels/double.wasm": expected 043488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad, the file hashes to 943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad`}},
		{"sha256 missing", replace(`ptx_sha256 = "ebd4d2b5ac52fd7c2e6737638ecb7420a56f3be093050ddbdf1ec7eaaef04ada"`, ""),
			[]string{`kernel[0].ptx_sha256: required key is missing (the file's sha256 is ebd4d2b5ac52fd7c2e6737638ecb7420a56f3be093050ddbdf1ec7eaaef04ada)`}},
		{"wrong signature", replace(`wasm = "kernels/double.wasm"
wasm_sha256 = "943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"`, `wasm = "kernels/wrongsig.wasm"
wasm_sha256 = "2260e299246e546e1f6b9342e00478464616dcb80e348794004ea4b125039e81"`),
			[]string{`host.toml:17: kernel[0].wasm: "testdata/kernels/wrongsig.wasm": kernel "double": export "double" is (i32) -> (), want (i32, i32, i32, i32, i32) -> ()`}},
		{"tenant not a string", goodKernel + "\ntenant = 3", []string{`host.toml:23: kernel[0].tenant: must be a string, not an integer`}},
		{"bad kind", replace(`kind = "u32"`, `kind = "u16"`), []string{`kernel[0].args[2].kind: unknown kind "u16" (want buffer, u32, u64, i32, f32)`}},
		// A missing or unknown kind is the one error: the table's dtype
		// and dir are not also unknown keys.
		{"bad kind of a buffer", replace(`kind = "buffer", dtype = "f32", dir = "in"`, `kind = "buf", dtype = "f32", dir = "in"`),
			[]string{`host.toml:20: kernel[0].args[0].kind: unknown kind "buf" (want buffer, u32, u64, i32, f32)`}},
		{"no kind", replace(`kind = "buffer", dtype = "f32", dir = "in"`, `dtype = "f32", dir = "in"`),
			[]string{`host.toml:20: kernel[0].args[0].kind: required key is missing`}},
		// The Wasm module is refused as its load would refuse it
		// (testdata/kernels/minmem.wasm and badtype.wasm are copies of
		// stages/testdata/kernels', built from the .wat there).
		{"memory minimum over the limit", replace(`wasm = "kernels/double.wasm"
wasm_sha256 = "943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"`, `wasm = "kernels/minmem.wasm"
wasm_sha256 = "62c209449cc741dcbef02cbcff61da0aac29a84e3280129a659a575f971863de"`),
			[]string{`host.toml:17: kernel[0].wasm: "testdata/kernels/minmem.wasm": kernel "double": its memory's minimum is 8192 pages (512 MiB), over the kernel memory limit of 4096 pages (256 MiB): it could never be instantiated`}},
		{"does not validate", replace(`wasm = "kernels/double.wasm"
wasm_sha256 = "943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"`, `wasm = "kernels/badtype.wasm"
wasm_sha256 = "dc0d58cc1f2b8472a1e019e929545df1f0d71f4f85100b3a8c7374b9b3a5578e"`),
			[]string{`host.toml:17: kernel[0].wasm: "testdata/kernels/badtype.wasm": kernel "double": does not compile: invalid function[0] export["double"]: cannot pop the 1st operand for i32.add: type mismatch: expected i32, but was f32`}},
		{"scalar dir", replace(`kind = "u32"`, `kind = "u32", dir = "out"`), []string{`kernel[0].args[2].dir: only a buffer argument has a dir (this one is a u32 scalar)`}},
		{"f32 scalar dtype", replace(`kind = "u32"`, `kind = "f32", dtype = "f32"`), []string{`kernel[0].args[2].dtype: only a buffer argument has a dtype (this one is an f32 scalar)`}},
		{"buffer without dir", replace(`dtype = "f32", dir = "in"`, `dtype = "f32"`), []string{`kernel[0].args[0].dir: required key is missing`}},
		{"unknown key", goodKernel + "\ngrid = 4", []string{`kernel[0].grid: unknown key`}},
		{"duplicate arg", replace(`name = "n"`, `name = "x"`), []string{`host.toml:22: kernel[0].args[2].name: duplicate argument name "x" (also at kernel[0].args[0].name, line 20)`}},
		{"no entry", replace(`entry = "double"`, ""), []string{`kernel[0].entry: required key is missing`}},
		{"bad jit_timeout", goodKernel + "\njit_timeout = \"0s\"", []string{`kernel[0].jit_timeout: must be positive`}},
		{"bad max_local_memory unit", goodKernel + "\nmax_local_memory = \"1gb\"", []string{`host.toml:23: kernel[0].max_local_memory: unknown size unit "gb" in "1gb"`}},
		{"negative max_local_memory", goodKernel + "\nmax_local_memory = -1", []string{`host.toml:23: kernel[0].max_local_memory: a size must not be negative, got -1`}},
		{"max_local_memory not a size", goodKernel + "\nmax_local_memory = true", []string{`host.toml:23: kernel[0].max_local_memory: must be a size: an integer (bytes) or a string such as "64MiB", not a boolean`}},
	} {
		t.Run(row.name, func(t *testing.T) {
			_, err := Decode(filepath.Join("testdata", "host.toml"), kernelToml(row.kernel), nil)
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("err = %v", err)
			}
			var got []string
			for _, e := range errs.List {
				got = append(got, e.Error())
			}
			for _, w := range row.want {
				found := false
				for _, g := range got {
					found = found || strings.Contains(g, w)
				}
				if !found {
					t.Errorf("want an error containing %q, got:\n%s", w, strings.Join(got, "\n"))
				}
			}
			if len(got) != len(row.want) {
				t.Errorf("got %d errors, want %d:\n%s", len(got), len(row.want), strings.Join(got, "\n"))
			}
		})
	}
}

// TestKernelPrograms: a session lists a [[kernel]] in programs; a kernel
// may not take a built-in program's name, and a sim session needs the
// kernel's Wasm module.
func TestKernelPrograms(t *testing.T) {
	noWasm := strings.Replace(strings.Replace(goodKernel, `wasm = "kernels/double.wasm"`, "", 1),
		`wasm_sha256 = "943488418cf6857f098941af5f04b6dbc7b2bb730a02be9a240882ee702109ad"`, "", 1)
	_, err := Decode(filepath.Join("testdata", "host.toml"), kernelToml(noWasm), nil)
	if err == nil || !strings.Contains(err.Error(), `session[0].programs[1]: kernel "double" has no wasm: a session on a sim device runs a kernel's Wasm module`) {
		t.Fatalf("err = %v", err)
	}
	// A misspelt kernel name: the close name suggested is the kernel's,
	// as a built-in program's would be.
	typo := strings.Replace(string(kernelToml(goodKernel)), `programs = ["fill", "double"]`, `programs = ["fill", "doubel"]`, 1)
	_, err = Decode(filepath.Join("testdata", "host.toml"), []byte(typo), nil)
	if want := `testdata/host.toml:29: session[0].programs[1]: no program "doubel" on backend sim (did you mean "double"?)`; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
	// A kernel whose own name is refused is not suggested.
	upper := strings.Replace(string(kernelToml(goodKernel)), `name = "double"`, `name = "Double"`, 1)
	_, err = Decode(filepath.Join("testdata", "host.toml"), []byte(upper), nil)
	if err == nil || !strings.Contains(err.Error(), `session[0].programs[1]: no program "double" on backend sim (it has `) || strings.Contains(err.Error(), "did you mean") {
		t.Fatalf("err = %v", err)
	}
	builtin := strings.Replace(string(kernelToml(goodKernel)), `name = "double"`, `name = "fill"`, 1)
	_, err = Decode(filepath.Join("testdata", "host.toml"), []byte(builtin), nil)
	if err == nil || !strings.Contains(err.Error(), `kernel[0].name: "fill" is a built-in program's name`) {
		t.Fatalf("err = %v", err)
	}
}

// TestKernelTenantDerived: a session that lists a vendor kernel and no
// tenant key belongs to the kernel's tenant (its tenant key, else its
// name), so that its worker is a failure domain of its own.
func TestKernelTenantDerived(t *testing.T) {
	m, err := Decode(filepath.Join("testdata", "host.toml"), kernelToml(goodKernel), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("s").TenantName(); got != "double" {
		t.Fatalf("tenant of a session listing kernel double = %q, want %q", got, "double")
	}
	m, err = Decode(filepath.Join("testdata", "host.toml"), kernelToml(goodKernel+"\ntenant = \"acme\""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("s").TenantName(); got != "acme" {
		t.Fatalf("tenant of a session listing acme's kernel = %q, want %q", got, "acme")
	}
	_, err = Decode(filepath.Join("testdata", "host.toml"), kernelToml(strings.Replace(goodKernel, "entry", "tenant = \"a.b\"\nentry", 1)), nil)
	if err == nil || !strings.HasPrefix(err.Error(), `testdata/host.toml:19: kernel[0].tenant: "a.b" is not a tenant name: 1 to 64 of letters, digits, '-' and '_'`) {
		t.Fatalf("a kernel tenant that is no tenant name: err = %v", err)
	}
}

// TestKernelTenantRules: a kernel's tenant key follows [[tenant]]'s name
// rule; a kernel with one runs only in that tenant's workers, whatever
// the session's tenant key says; a kernel without one runs in the
// session's tenant, or, for a session without a tenant key, is a tenant
// of its own, which its name must then be able to be.
func TestKernelTenantRules(t *testing.T) {
	const tenants = "\n[[tenant]]\nname = \"acme\"\n[[tenant]]\nname = \"Beta\"\n"
	decode := func(kernel, session string) (*Manifest, error) {
		return Decode(filepath.Join("testdata", "host.toml"), append(kernelToml(kernel), session+tenants...), nil)
	}
	// [[tenant]]'s names are the kernel tenant key's: "Beta" is both.
	m, err := decode(goodKernel+"\ntenant = \"Beta\"", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("s").TenantName(); got != "Beta" {
		t.Fatalf("tenant = %q, want Beta", got)
	}
	// A session's tenant key takes a kernel that has none.
	m, err = decode(goodKernel, `tenant = "acme"`)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Session("s").TenantName(); got != "acme" {
		t.Fatalf("tenant = %q, want acme", got)
	}
	// ... but never another tenant's kernel.
	_, err = decode(goodKernel+"\ntenant = \"acme\"", `tenant = "Beta"`)
	if want := `testdata/host.toml:31: session[0].tenant: the session is tenant "Beta"'s, and vendor kernel "double" is tenant "acme"'s: a kernel with a tenant key runs only in its own tenant's workers`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("another tenant's kernel: err = %v, want %s…", err, want)
	}
	// A kernel whose name cannot be a tenant's, with no tenant key.
	dotted := strings.Replace(string(kernelToml(goodKernel)), `name = "double"`, `name = "double.v2"`, 1)
	dotted = strings.Replace(dotted, `programs = ["fill", "double"]`, `programs = ["fill", "double.v2"]`, 1)
	_, err = Decode(filepath.Join("testdata", "host.toml"), []byte(dotted), nil)
	if want := `testdata/host.toml:29: session[0].programs: vendor kernel "double.v2" has no tenant key and its name is not a tenant name`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a dotted kernel name: err = %v, want %s…", err, want)
	}
	if _, err := Decode(filepath.Join("testdata", "host.toml"), []byte(dotted+`tenant = "acme"`+tenants), nil); err != nil {
		t.Fatalf("a dotted kernel name in a session with a tenant key: %v", err)
	}
}
