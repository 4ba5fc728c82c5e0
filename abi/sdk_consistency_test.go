package abi

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// The guest SDK (../guest-sdk, its own module) and the C header restate
// this package's constants for guests. These tests read their source, not
// their packages, and fail when any status code, host function, export,
// limit or record layout drifts from package abi.

const sdkDir = "../guest-sdk"

// goFile is one parsed Go source file of the SDK.
type goFile struct {
	name string
	f    *ast.File
}

func parseGoDir(t *testing.T, dir string) []goFile {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(matches) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	var files []goFile
	fset := token.NewFileSet()
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, goFile{filepath.Base(m), f})
	}
	return files
}

// goConsts evaluates the package-level constants of files that have
// explicit values: integer and string literals, conversions, and
// expressions of them and of other constants.
func goConsts(t *testing.T, files []goFile) map[string]constant.Value {
	t.Helper()
	exprs := map[string]ast.Expr{}
	for _, gf := range files {
		for _, d := range gf.f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Values) != len(vs.Names) {
					continue // iota: not evaluated, so reported missing if needed
				}
				for i, n := range vs.Names {
					exprs[n.Name] = vs.Values[i]
				}
			}
		}
	}
	// Constants whose expressions this cannot evaluate (selectors of other
	// packages, say) are left out and reported missing if a test needs
	// them.
	vals := map[string]constant.Value{}
	var eval func(e ast.Expr) constant.Value // nil: cannot evaluate
	eval = func(e ast.Expr) constant.Value {
		switch e := e.(type) {
		case *ast.BasicLit:
			return constant.MakeFromLiteral(e.Value, e.Kind, 0)
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.Ident:
			if v, ok := vals[e.Name]; ok {
				return v
			}
			x, ok := exprs[e.Name]
			if !ok {
				return nil
			}
			v := eval(x)
			if v != nil {
				vals[e.Name] = v
			}
			return v
		case *ast.BinaryExpr:
			x, y := eval(e.X), eval(e.Y)
			if x == nil || y == nil {
				return nil
			}
			if e.Op == token.SHL || e.Op == token.SHR {
				s, _ := constant.Uint64Val(y)
				return constant.Shift(x, e.Op, uint(s))
			}
			return constant.BinaryOp(x, e.Op, y)
		case *ast.CallExpr: // a conversion such as Status(3)
			if len(e.Args) == 1 {
				return eval(e.Args[0])
			}
		}
		return nil
	}
	for name, e := range exprs {
		if _, done := vals[name]; !done {
			if v := eval(e); v != nil {
				vals[name] = v
			}
		}
	}
	return vals
}

func intConst(t *testing.T, consts map[string]constant.Value, name string) int64 {
	t.Helper()
	v, ok := consts[name]
	if !ok {
		t.Fatalf("constant %s missing", name)
	}
	i, exact := constant.Int64Val(v)
	if !exact {
		t.Fatalf("constant %s is not an integer", name)
	}
	return i
}

func strConst(t *testing.T, consts map[string]constant.Value, name string) string {
	t.Helper()
	v, ok := consts[name]
	if !ok || v.Kind() != constant.String {
		t.Fatalf("string constant %s missing", name)
	}
	return constant.StringVal(v)
}

// compositeVar returns the elements of the package-level variable name,
// which must be a composite literal with keyed elements.
func compositeVar(t *testing.T, files []goFile, name string) []*ast.KeyValueExpr {
	t.Helper()
	for _, gf := range files {
		for _, d := range gf.f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name || i >= len(vs.Values) {
						continue
					}
					cl, ok := vs.Values[i].(*ast.CompositeLit)
					if !ok {
						t.Fatalf("%s is not a composite literal", name)
					}
					var kvs []*ast.KeyValueExpr
					for _, el := range cl.Elts {
						kv, ok := el.(*ast.KeyValueExpr)
						if !ok {
							t.Fatalf("%s has an unkeyed element", name)
						}
						kvs = append(kvs, kv)
					}
					return kvs
				}
			}
		}
	}
	t.Fatalf("variable %s not found", name)
	return nil
}

func identName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func TestGoSDKStatusCodes(t *testing.T) {
	files := parseGoDir(t, sdkDir)
	consts := goConsts(t, files)

	// The Status constants: exactly one per ABI code, with its value.
	byValue := map[int64]string{}
	for name := range consts {
		if !strings.HasPrefix(name, "Status") {
			continue
		}
		v := intConst(t, consts, name)
		if prev, dup := byValue[v]; dup {
			t.Errorf("SDK statuses %s and %s are both %d", prev, name, v)
		}
		byValue[v] = name
		if v < 0 || v >= int64(numStatus) {
			t.Errorf("SDK status %s = %d is not an ABI v1 code", name, v)
		}
	}
	if len(byValue) != int(numStatus) {
		t.Errorf("SDK has %d status constants, ABI v1 has %d", len(byValue), numStatus)
	}

	names := map[string]string{} // SDK constant -> its ABI name in statusNames
	for _, kv := range compositeVar(t, files, "statusNames") {
		s, err := strconv.Unquote(kv.Value.(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		names[identName(kv.Key)] = s
	}
	classes := map[string]string{} // SDK constant -> SDK constant of its class
	for _, kv := range compositeVar(t, files, "statusClasses") {
		classes[identName(kv.Key)] = identName(kv.Value)
	}
	sentinels := map[string]string{} // SDK constant -> sentinel variable
	for _, kv := range compositeVar(t, files, "sentinels") {
		sentinels[identName(kv.Key)] = identName(kv.Value)
	}

	for s := StatusOK; s < numStatus; s++ {
		c, ok := byValue[int64(s)]
		if !ok {
			t.Errorf("SDK has no constant for %v (%d)", s, s)
			continue
		}
		if names[c] != s.String() {
			t.Errorf("SDK names %s (%d) %q, ABI %q", c, s, names[c], s.String())
		}
		wantClass := StatusOf(s.Class())
		if s == StatusOK {
			wantClass = StatusOK
		}
		if cls := classes[c]; cls == "" || intConst(t, consts, cls) != int64(wantClass) {
			t.Errorf("SDK class of %v is %s, ABI %v", s, cls, wantClass)
		}
		if s != StatusOK && sentinels[c] == "" {
			t.Errorf("SDK has no sentinel error for %v", s)
		}
	}
}

// wasmType maps a Go parameter or result type of a //go:wasmimport function
// to its Wasm type.
func wasmType(e ast.Expr) (api.ValueType, bool) {
	switch t := e.(type) {
	case *ast.Ident:
		switch t.Name {
		case "int32", "uint32":
			return api.ValueTypeI32, true
		case "int64", "uint64":
			return api.ValueTypeI64, true
		}
	case *ast.SelectorExpr:
		if identName(t.X) == "unsafe" && t.Sel.Name == "Pointer" {
			return api.ValueTypeI32, true // a linear-memory address
		}
	}
	return 0, false
}

func fieldTypes(t *testing.T, fl *ast.FieldList) []api.ValueType {
	t.Helper()
	var out []api.ValueType
	if fl == nil {
		return out
	}
	for _, f := range fl.List {
		vt, ok := wasmType(f.Type)
		if !ok {
			t.Errorf("unsupported wasm parameter type %T", f.Type)
		}
		for range max(1, len(f.Names)) {
			out = append(out, vt)
		}
	}
	return out
}

// directives returns the //go:NAME directives of fd as "NAME args".
func directives(fd *ast.FuncDecl, name string) []string {
	var out []string
	if fd.Doc == nil {
		return out
	}
	for _, c := range fd.Doc.List {
		if rest, ok := strings.CutPrefix(c.Text, "//go:"+name+" "); ok {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out
}

func sigString(p, r []api.ValueType) string {
	var ps, rs []string
	for _, v := range p {
		ps = append(ps, api.ValueTypeName(v))
	}
	for _, v := range r {
		rs = append(rs, api.ValueTypeName(v))
	}
	return "(" + strings.Join(ps, ",") + ") -> (" + strings.Join(rs, ",") + ")"
}

func wasmFuncs(t *testing.T, files []goFile, directive string) map[string][2][]api.ValueType {
	out := map[string][2][]api.ValueType{}
	for _, gf := range files {
		for _, d := range gf.f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			for _, dir := range directives(fd, directive) {
				fields := strings.Fields(dir)
				name := fields[len(fields)-1]
				if directive == "wasmimport" {
					if len(fields) != 2 || fields[0] != ImportModule {
						t.Errorf("%s: //go:wasmimport %s: want module %s", gf.name, dir, ImportModule)
					}
				}
				if _, dup := out[name]; dup {
					t.Errorf("%s declared twice", name)
				}
				out[name] = [2][]api.ValueType{fieldTypes(t, fd.Type.Params), fieldTypes(t, fd.Type.Results)}
			}
		}
	}
	return out
}

func TestGoSDKImportsAndExports(t *testing.T) {
	root := parseGoDir(t, sdkDir)
	imports := wasmFuncs(t, root, "wasmimport")
	for name, sig := range Functions {
		got, ok := imports[name]
		if !ok {
			t.Errorf("SDK does not declare host function %s", name)
			continue
		}
		if !slices.Equal(got[0], sig.Params) || !slices.Equal(got[1], sig.Results) {
			t.Errorf("SDK declares %s as %s, ABI %s", name, sigString(got[0], got[1]), sigString(sig.Params, sig.Results))
		}
	}
	for name := range imports {
		if _, ok := Functions[name]; !ok {
			t.Errorf("SDK imports %s, which ABI v1 does not define", name)
		}
	}

	checkExports := func(where string, got map[string][2][]api.ValueType, want ...string) {
		t.Helper()
		var names []string
		for n, sig := range got {
			names = append(names, n)
			exp, ok := ExportSignatures[n]
			if !ok {
				t.Errorf("%s exports %s, which is not an ABI v1 export", where, n)
				continue
			}
			if !slices.Equal(sig[0], exp.Params) || !slices.Equal(sig[1], exp.Results) {
				t.Errorf("%s exports %s as %s, ABI %s", where, n, sigString(sig[0], sig[1]), sigString(exp.Params, exp.Results))
			}
		}
		slices.Sort(names)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Errorf("%s exports %v, want exactly %v", where, names, want)
		}
	}
	// The root package never exports the fence or init: their presence
	// changes what the host does.
	checkExports("package stagehost", wasmFuncs(t, root, "wasmexport"), Marker, ExportRun)
	checkExports("package fence", wasmFuncs(t, parseGoDir(t, filepath.Join(sdkDir, "fence")), "wasmexport"), ExportFence)

	consts := goConsts(t, root)
	for name, want := range map[string]int64{
		"Version":          Version,
		"Revision":         Revision,
		"MaxArgs":          MaxArgs,
		"MaxBatch":         MaxBatch,
		"MaxErrorMessage":  MaxErrorMessage,
		"ToEnd":            ToEnd,
		"argRecordSize":    ArgRecordSize,
		"batchRecordSize":  BatchRecordSize,
		"tensorRecordSize": TensorRecordSize,
		"maxTensorRank":    MaxTensorRank,
		"argScalar":        int64(ArgScalar),
		"argBuffer":        int64(ArgBuffer),
		"kindStream":       int64(KindStream),
		"kindBuffer":       int64(KindBuffer),
		"kindProgram":      int64(KindProgram),
		"LevelDebug":       int64(LogDebug),
		"LevelInfo":        int64(LogInfo),
		"LevelWarn":        int64(LogWarn),
		"LevelError":       int64(LogError),
	} {
		if got := intConst(t, consts, name); got != want {
			t.Errorf("SDK %s = %d, ABI %d", name, got, want)
		}
	}
	for name, want := range map[string]string{
		"importModule": ImportModule,
		"abiMarker":    Marker,
		"runExport":    ExportRun,
		"DefaultEntry": DefaultEntryName,
	} {
		if got := strConst(t, consts, name); got != want {
			t.Errorf("SDK %s = %q, ABI %q", name, got, want)
		}
	}
}

// The emulator is a host of its own: its limits, handle layout and kernels
// must be the real host's.
func TestEmulatorConstants(t *testing.T) {
	files := parseGoDir(t, filepath.Join(sdkDir, "emu"))
	consts := goConsts(t, files)
	for name, want := range map[string]int64{
		"kindStream":       int64(KindStream),
		"kindBuffer":       int64(KindBuffer),
		"kindProgram":      int64(KindProgram),
		"maxTag":           MaxTag,
		"maxArgs":          MaxArgs,
		"maxBatch":         MaxBatch,
		"argRecordSize":    ArgRecordSize,
		"batchRecordSize":  BatchRecordSize,
		"tensorRecordSize": TensorRecordSize,
		"toEnd":            ToEnd,
		"maxErrorMessage":  MaxErrorMessage,
	} {
		if got := intConst(t, consts, name); got != want {
			t.Errorf("emu %s = %d, ABI %d", name, got, want)
		}
	}
	kernels := simKernels(t)
	for _, kv := range compositeVar(t, files, "builtins") {
		name, _ := strconv.Unquote(kv.Key.(*ast.BasicLit).Value)
		if !slices.Contains(kernels, name) {
			t.Errorf("emu kernel %q is not a hw/sim kernel (%v)", name, kernels)
		}
	}
}

// simKernels lists the kernels hw/sim registers (Register("name", ...)
// calls, and the names of the hw.KernelInfo{Name: "name", ...}
// descriptions its library registers, in its source; read, not imported,
// so that hw/sim may import this package).
func simKernels(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, gf := range parseGoDir(t, "../hw/sim") {
		ast.Inspect(gf.f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok {
				if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "KernelInfo" {
					for _, e := range lit.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if !ok || identName(kv.Key) != "Name" {
							continue
						}
						if v, ok := kv.Value.(*ast.BasicLit); ok && v.Kind == token.STRING {
							name, _ := strconv.Unquote(v.Value)
							names = append(names, name)
						}
					}
				}
				return true
			}
			call, ok := n.(*ast.CallExpr)
			if !ok || identName(call.Fun) != "Register" || len(call.Args) != 2 {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				name, _ := strconv.Unquote(lit.Value)
				names = append(names, name)
			}
			return true
		})
	}
	if len(names) == 0 {
		t.Fatal("found no kernel registrations in hw/sim")
	}
	return names
}

// cHeader is the parsed C header.
type cHeader struct {
	text    string
	defines map[string]string
}

func readCHeader(t *testing.T) cHeader {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sdkDir, "c", "stagehost.h"))
	if err != nil {
		t.Fatal(err)
	}
	h := cHeader{text: string(b), defines: map[string]string{}}
	re := regexp.MustCompile(`(?m)^#define\s+(STAGEHOST_\w+)(\([^)]*\))?[ \t]+(.*)$`)
	for _, m := range re.FindAllStringSubmatch(h.text, -1) {
		if m[2] != "" {
			continue // function-like macro
		}
		h.defines[m[1]] = strings.TrimSpace(m[3])
	}
	return h
}

func (h cHeader) int(t *testing.T, name string) int64 {
	t.Helper()
	s, ok := h.defines[name]
	if !ok {
		t.Errorf("C header: %s not defined", name)
		return -1
	}
	s = strings.TrimRight(strings.Fields(s)[0], "uUlL")
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		t.Errorf("C header: %s = %q is not an integer", name, s)
		return -1
	}
	return v
}

func TestCHeaderStatusCodes(t *testing.T) {
	h := readCHeader(t)
	known := map[string]bool{}
	for s := StatusOK; s < numStatus; s++ {
		name := "STAGEHOST_" + s.String()
		known[name] = true
		if got := h.int(t, name); got != int64(s) {
			t.Errorf("C header: %s = %d, ABI %d", name, got, s)
		}
	}
	// The dtype codes are the op library's (docs/kernels.md: 0 f32, 1 f16,
	// 2 bf16, 3 i32).
	for name, want := range map[string]int64{"STAGEHOST_DTYPE_F32": 0, "STAGEHOST_DTYPE_F16": 1, "STAGEHOST_DTYPE_BF16": 2, "STAGEHOST_DTYPE_I32": 3} {
		if got := h.int(t, name); got != want {
			t.Errorf("C header: %s = %d, want %d", name, got, want)
		}
	}
	// Every other integer define is one of the known non-status families
	// (EMU_: the outcomes of the C emulator, emu.c).
	nonStatus := regexp.MustCompile(`^STAGEHOST_(LOG_|KIND_|DTYPE_|MAX_|ARG_|BATCH_|TENSOR_|EMU_|TO_END$|ABI_VERSION$|ABI_REVISION$|IMPORT_MODULE$)`)
	for name, value := range h.defines {
		if f := strings.Fields(value); len(f) == 0 {
			continue
		} else if _, err := strconv.ParseInt(strings.TrimRight(f[0], "uUlL"), 0, 64); err != nil {
			continue // not an integer: an attribute or type macro
		}
		if !known[name] && !nonStatus.MatchString(name) {
			t.Errorf("C header: %s looks like a status code ABI v1 does not have", name)
		}
	}
}

// cWasmType maps a C parameter declaration to its wasm32 type.
func cWasmType(param string) (api.ValueType, bool) {
	p := strings.TrimSpace(param)
	switch {
	case strings.Contains(p, "*"):
		return api.ValueTypeI32, true // wasm32 pointer
	case strings.HasPrefix(p, "uint64_t "), strings.HasPrefix(p, "int64_t "), strings.HasPrefix(p, "stagehost_handle "):
		return api.ValueTypeI64, true
	case strings.HasPrefix(p, "uint32_t "), strings.HasPrefix(p, "int32_t "):
		return api.ValueTypeI32, true
	}
	return 0, false
}

func TestCHeaderFunctions(t *testing.T) {
	h := readCHeader(t)
	if !strings.Contains(h.text, `#define STAGEHOST_IMPORT(name) __attribute__((import_module("`+ImportModule+`"), import_name(name)))`) {
		t.Errorf("C header: STAGEHOST_IMPORT does not import from %s", ImportModule)
	}
	if got := strings.Trim(h.defines["STAGEHOST_IMPORT_MODULE"], `"`); got != ImportModule {
		t.Errorf("C header: STAGEHOST_IMPORT_MODULE = %q", got)
	}
	re := regexp.MustCompile(`STAGEHOST_IMPORT\("(\w+)"\)\s+(\w+)\s+stagehost_(\w+)\(([^)]*)\);`)
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(h.text, -1) {
		name, result, cname, params := m[1], m[2], m[3], m[4]
		seen[name] = true
		sig, ok := Functions[name]
		if !ok {
			t.Errorf("C header imports %s, which ABI v1 does not define", name)
			continue
		}
		if cname != name {
			t.Errorf("C header: import %s is declared as stagehost_%s", name, cname)
		}
		if result != "stagehost_status" {
			t.Errorf("C header: %s returns %s", name, result)
		}
		var got []api.ValueType
		for _, p := range strings.Split(params, ",") {
			vt, ok := cWasmType(p)
			if !ok {
				t.Errorf("C header: %s: cannot map parameter %q", name, p)
			}
			got = append(got, vt)
		}
		if !slices.Equal(got, sig.Params) {
			t.Errorf("C header declares %s as %s, ABI %s", name, sigString(got, nil), sigString(sig.Params, nil))
		}
	}
	for name := range Functions {
		if !seen[name] {
			t.Errorf("C header does not declare host function %s", name)
		}
	}
	if got := h.int(t, "STAGEHOST_ABI_REVISION"); got != Revision {
		t.Errorf("C header: STAGEHOST_ABI_REVISION = %d, ABI %d", got, Revision)
	}
	if !strings.Contains(h.text, `STAGEHOST_EXPORT("`+Marker+`") void `+Marker+`(void) {}`) {
		t.Errorf("C header: STAGEHOST_ABI_V1 does not define the %s export", Marker)
	}
}

// cStruct computes the field offsets and size of a C struct of fixed-width
// integer fields under wasm32's natural alignment.
func cStruct(t *testing.T, text, name string) (offsets map[string]int, size int) {
	t.Helper()
	re := regexp.MustCompile(`(?s)typedef struct ` + name + ` \{(.*?)\} ` + name + `;`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("C header: struct %s not found", name)
	}
	offsets = map[string]int{}
	field := regexp.MustCompile(`(?m)^\s*(\w+)\s+(\w+)(?:\[(\d+)\])?;`)
	align := 1
	for _, f := range field.FindAllStringSubmatch(m[1], -1) {
		var n int
		switch f[1] {
		case "uint32_t", "int32_t":
			n = 4
		case "uint64_t", "int64_t", "stagehost_handle":
			n = 8
		default:
			t.Fatalf("C header: %s.%s has type %s", name, f[2], f[1])
		}
		count := 1
		if f[3] != "" {
			count, _ = strconv.Atoi(f[3])
		}
		size = (size + n - 1) / n * n
		offsets[f[2]] = size
		size += n * count
		align = max(align, n)
	}
	size = (size + align - 1) / align * align
	return offsets, size
}

func TestCHeaderRecords(t *testing.T) {
	h := readCHeader(t)
	for name, want := range map[string]int64{
		"STAGEHOST_ABI_VERSION":        Version,
		"STAGEHOST_MAX_ARGS":           MaxArgs,
		"STAGEHOST_MAX_BATCH":          MaxBatch,
		"STAGEHOST_MAX_ERROR_MESSAGE":  MaxErrorMessage,
		"STAGEHOST_ARG_RECORD_SIZE":    ArgRecordSize,
		"STAGEHOST_BATCH_RECORD_SIZE":  BatchRecordSize,
		"STAGEHOST_TENSOR_RECORD_SIZE": TensorRecordSize,
		"STAGEHOST_MAX_TENSOR_RANK":    MaxTensorRank,
		"STAGEHOST_ARG_SCALAR":         int64(ArgScalar),
		"STAGEHOST_ARG_BUFFER":         int64(ArgBuffer),
		"STAGEHOST_TO_END":             ToEnd,
		"STAGEHOST_KIND_STREAM":        int64(KindStream),
		"STAGEHOST_KIND_BUFFER":        int64(KindBuffer),
		"STAGEHOST_KIND_PROGRAM":       int64(KindProgram),
		"STAGEHOST_LOG_DEBUG":          int64(LogDebug),
		"STAGEHOST_LOG_INFO":           int64(LogInfo),
		"STAGEHOST_LOG_WARN":           int64(LogWarn),
		"STAGEHOST_LOG_ERROR":          int64(LogError),
	} {
		if got := h.int(t, name); got != want {
			t.Errorf("C header: %s = %d, ABI %d", name, got, want)
		}
	}
	// Layouts of ABI.md §3.1 and §3.2.
	for _, c := range []struct {
		name    string
		size    int
		offsets map[string]int
		sizeDef string
	}{
		{"stagehost_arg", ArgRecordSize, map[string]int{"kind": 0, "offset": 4, "length": 8, "reserved": 12, "value": 16}, "STAGEHOST_ARG_RECORD_SIZE"},
		{"stagehost_command", BatchRecordSize, map[string]int{"program": 0, "args_ptr": 8, "args_count": 12}, "STAGEHOST_BATCH_RECORD_SIZE"},
		{"stagehost_tensor_record", TensorRecordSize, map[string]int{"buffer": 0, "offset": 8, "nbytes": 16, "dtype": 24, "rank": 28, "dims": 32}, "STAGEHOST_TENSOR_RECORD_SIZE"},
	} {
		offsets, size := cStruct(t, h.text, c.name)
		if size != c.size {
			t.Errorf("C header: sizeof(%s) = %d, ABI %d", c.name, size, c.size)
		}
		if !mapsEqual(offsets, c.offsets) {
			t.Errorf("C header: %s fields at %v, ABI %v", c.name, offsets, c.offsets)
		}
		if !strings.Contains(h.text, "_Static_assert(sizeof("+c.name+") == "+c.sizeDef) {
			t.Errorf("C header: no _Static_assert on sizeof(%s)", c.name)
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRevisions checks the revisions of v1 (ABI.md §1.4): every function
// of [AddedIn] is a v1 function of a revision after the first and at most
// [Revision], the highest of them is [Revision], and ABI.md's §3 row of
// each function says "revision N" exactly when AddedIn lists it.
func TestRevisions(t *testing.T) {
	highest := 1
	for name, rev := range AddedIn {
		if _, ok := Functions[name]; !ok {
			t.Errorf("AddedIn lists %s, which is not a host function", name)
		}
		if rev < 2 || rev > Revision {
			t.Errorf("AddedIn[%s] = %d, want 2 to %d", name, rev, Revision)
		}
		highest = max(highest, rev)
	}
	if highest != Revision {
		t.Errorf("Revision = %d, but the latest function added is of revision %d", Revision, highest)
	}
	doc, err := os.ReadFile("ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(\\w+)` \\| `\\([^`]*\\) -> i32` \\|(.*)$")
	mark := regexp.MustCompile(`\*\*revision (\d+)\*\*`)
	seen := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		name := m[1]
		if _, ok := Functions[name]; !ok {
			continue
		}
		seen[name] = true
		got := 1
		if mm := mark.FindStringSubmatch(m[2]); mm != nil {
			got, _ = strconv.Atoi(mm[1])
		}
		want := AddedIn[name]
		if want == 0 {
			want = 1
		}
		if got != want {
			t.Errorf("ABI.md §3: %s is marked of revision %d, AddedIn says %d", name, got, want)
		}
	}
	for name := range Functions {
		if !seen[name] {
			t.Errorf("ABI.md §3 has no row for %s", name)
		}
	}
}
