package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/stages"
)

// DefaultJITTimeout bounds compiling a vendor kernel's PTX when the
// [[kernel]] sets no jit_timeout.
const DefaultJITTimeout = 30 * time.Second

// DefaultMaxLocalMemory bounds a vendor kernel's worst-case local memory
// reservation on a cuda GPU when the [[kernel]] sets no
// max_local_memory: 1GiB ([cuda.DefaultMaxLocalMemory]).
const DefaultMaxLocalMemory = cuda.DefaultMaxLocalMemory

// Kernel argument kinds of a [[kernel]]'s args.
var KernelArgKinds = []string{"buffer", "u32", "u64", "i32", "f32"}

// Kernel buffer dtypes and directions.
var (
	KernelDTypes = []string{"f32", "f16", "bf16", "i32", "bytes"}
	KernelDirs   = []string{"in", "out", "inout"}
)

// Kernel is one [[kernel]]: a device program a vendor ships with the
// model (docs/manifest.md). Its files are checked when the manifest is
// read (they exist, hash to their sha256, and the Wasm module passes
// every check of its load, against the declaration and the default
// kernel memory limit that the load uses: [stages.ValidateKernel]); the
// PTX is checked against the driver by `stagehost check` on a machine
// with a GPU, and at load.
type Kernel struct {
	Name   string
	Tenant string // "" when not set: the tenant is then the kernel's name
	// PTX and Wasm are the paths as written; PTXFile and WasmFile are
	// resolved against the manifest's directory. "" when not given (at
	// least one of them is).
	PTX, PTXFile, PTXSHA256    string
	Wasm, WasmFile, WasmSHA256 string
	Entry                      string
	JITTimeout                 time.Duration // default DefaultJITTimeout
	// MaxLocalMemory bounds the PTX's worst-case local memory reservation
	// on the device, in bytes: local bytes per thread × multiprocessors ×
	// max threads per multiprocessor ([cuda.VendorLimits]). Default
	// DefaultMaxLocalMemory; 0 admits only kernels without local memory.
	MaxLocalMemory int64
	Args           []KernelArg
}

// KernelArg is one of a [[kernel]]'s args.
type KernelArg struct {
	Name  string
	Kind  string // buffer, u32, u64, i32 or f32
	DType string // for a buffer: f32, f16, bf16, i32 or bytes (default bytes)
	Dir   string // for a buffer: in, out or inout
}

// Spec returns the kernel's declaration for [stages.Engine.LoadKernel]
// and [stages.ValidateKernel].
func (k *Kernel) Spec() stages.KernelSpec {
	s := stages.KernelSpec{Name: k.Name, Entry: k.Entry, Args: make([]hw.KernelArg, len(k.Args))}
	for i, a := range k.Args {
		if a.Kind == "buffer" {
			s.Args[i] = hw.KernelBuffer(a.Name, a.DType, a.Dir, "")
		} else {
			s.Args[i] = hw.KernelScalar(a.Name, a.Kind)
		}
	}
	return s
}

// VendorLimits returns the limits the kernel's PTX is checked against
// on a cuda GPU ([cuda.Device.CheckVendor], [cuda.Device.PrepareVendorLimits]).
func (k *Kernel) VendorLimits() cuda.VendorLimits {
	return cuda.VendorLimits{MaxLocalMemory: uint64(k.MaxLocalMemory)}
}

// KernelNamed returns the [[kernel]] named name, or nil.
func (m *Manifest) KernelNamed(name string) *Kernel {
	for i := range m.Kernels {
		if m.Kernels[i].Name == name {
			return &m.Kernels[i]
		}
	}
	return nil
}

// kernelMeta is what the cross-checks need of one [[kernel]].
type kernelMeta struct {
	p    keyPath
	name bool
}

// kernels decodes the [[kernel]] tables and checks their files.
func (d *decoder) kernels(root *table, m *Manifest) []kernelMeta {
	list, _ := root.tables("kernel")
	metas := make([]kernelMeta, len(list))
	if len(list) > 0 {
		m.Kernels = make([]Kernel, len(list))
	}
	first := map[string]keyPath{}
	for i, t := range list {
		if t == nil {
			continue
		}
		k, meta := &m.Kernels[i], &metas[i]
		meta.p = t.path
		k.Name, meta.name = t.name("name")
		if meta.name && !validWeightsName(k.Name) {
			d.errorf(t.path.key("name"), "%q is not a kernel name: 1 to %d of a-z, 0-9, '_', '.' and '-'", k.Name, MaxWeightsName)
			meta.name = false
		}
		if meta.name && (slices.Contains(builtinPrograms(), k.Name)) {
			d.errorf(t.path.key("name"), "%q is a built-in program's name: a vendor kernel needs a name of its own", k.Name)
			meta.name = false
		}
		if meta.name {
			d.unique(t.path.key("name"), k.Name, "kernel", first)
		}
		if t.has("tenant") {
			if tenant, ok := t.str("tenant", "", false); !ok {
				k.Tenant = "" // reported: not a string
			} else if k.Tenant = tenant; !ValidTenantName(k.Tenant) {
				d.errorf(t.path.key("tenant"), "%q is not a tenant name: 1 to %d of letters, digits, '-' and '_'", k.Tenant, MaxTenantName)
				k.Tenant = ""
			}
		}
		k.Entry, _ = t.name("entry")
		k.JITTimeout, _ = t.duration("jit_timeout", DefaultJITTimeout, true)
		k.MaxLocalMemory, _ = t.size("max_local_memory", DefaultMaxLocalMemory, 0, math.MaxInt64)
		argsOK := d.kernelArgs(t, k)
		ptx, ptxOK := t.str("ptx", "", false)
		ptxSum, ptxSumOK := t.str("ptx_sha256", "", false)
		wasm, wasmOK := t.str("wasm", "", false)
		wasmSum, wasmSumOK := t.str("wasm_sha256", "", false)
		hasPTX, hasWasm := t.has("ptx"), t.has("wasm")
		hasPTXSum, hasWasmSum := t.has("ptx_sha256"), t.has("wasm_sha256")
		t.finish()
		if !hasPTX && !hasWasm {
			d.errorf(t.path, "a kernel needs ptx (for cuda devices) or wasm (for sim and cpu devices), or both")
		}
		if !hasPTX && hasPTXSum {
			d.errorf(t.path.key("ptx_sha256"), "ptx_sha256 without ptx")
		}
		if !hasWasm && hasWasmSum {
			d.errorf(t.path.key("wasm_sha256"), "wasm_sha256 without wasm")
		}
		if hasPTX && ptxOK {
			if ptx == "" {
				d.errorf(t.path.key("ptx"), "must not be empty")
			} else {
				k.PTX, k.PTXFile = ptx, resolve(d.dir, ptx)
				if data, ok := d.kernelFile(t, "ptx", k.PTXFile, ptxSum, hasPTXSum && ptxSumOK); ok {
					k.PTXSHA256 = hashOf(data)
				}
			}
		}
		if hasWasm && wasmOK {
			if wasm == "" {
				d.errorf(t.path.key("wasm"), "must not be empty")
			} else {
				k.Wasm, k.WasmFile = wasm, resolve(d.dir, wasm)
				if data, ok := d.kernelFile(t, "wasm", k.WasmFile, wasmSum, hasWasmSum && wasmSumOK); ok {
					k.WasmSHA256 = hashOf(data)
					if argsOK && meta.name && k.Entry != "" {
						if err := stages.ValidateKernel(data, k.Spec(), stages.NewKernelConfig()); err != nil {
							d.errorf(t.path.key("wasm"), "%q: %s", k.WasmFile, escapeUnprintable(err.Error()))
						}
					}
				}
			}
		}
	}
	return metas
}

func hashOf(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// kernelFile reads a kernel's ptx or wasm file through the manifest's
// reader and checks its sha256 (key+"_sha256"), printing the actual hash
// on a mismatch.
func (d *decoder) kernelFile(t *table, key, file, sum string, sumSet bool) ([]byte, bool) {
	data, err := d.read(file, d.moduleLimit)
	if err != nil {
		d.fileError(t.path.key(key), file, d.moduleLimit, err)
		return nil, false
	}
	actual, sk := hashOf(data), t.path.key(key+"_sha256")
	switch {
	case !sumSet:
		d.errorf(sk, "required key is missing (the file's sha256 is %s)", actual)
		return nil, false
	case sum == "":
		d.errorf(sk, "must not be empty: the file's sha256 is %s", actual)
		return nil, false
	}
	if b, herr := hex.DecodeString(sum); herr != nil || len(b) != 32 {
		d.errorf(sk, "must be 64 hexadecimal digits, got %q (the file's sha256 is %s)", sum, actual)
		return nil, false
	}
	if sum = strings.ToLower(sum); sum != actual {
		d.errorf(sk, "does not match %q: expected %s, the file hashes to %s", file, sum, actual)
		return nil, false
	}
	return data, true
}

// kernelArgs decodes a [[kernel]]'s args; false when any is wrong.
func (d *decoder) kernelArgs(t *table, k *Kernel) bool {
	list, ok := t.tables("args")
	if !t.has("args") {
		d.errorf(t.path.key("args"), "required key is missing (a kernel declares its arguments, in order)")
		return false
	}
	if len(list) > hw.MaxArgs {
		d.errorf(t.path.key("args"), "%d arguments, more than a launch carries (%d)", len(list), hw.MaxArgs)
		ok = false
	}
	k.Args = make([]KernelArg, len(list))
	names := map[string]keyPath{}
	for j, at := range list {
		if at == nil {
			continue
		}
		a := &k.Args[j]
		var nameOK, kindOK bool
		a.Name, nameOK = at.name("name")
		if nameOK && !d.unique(at.path.key("name"), a.Name, "argument", names) {
			ok = false
		}
		a.Kind, kindOK = at.str("kind", "", true)
		if kindOK && !slices.Contains(KernelArgKinds, a.Kind) {
			d.errorf(at.path.key("kind"), "unknown kind %q (want %s)", a.Kind, strings.Join(KernelArgKinds, ", "))
			kindOK = false
		}
		if a.Kind == "buffer" {
			var dtOK, dirOK bool
			if a.DType, dtOK = at.str("dtype", "bytes", false); dtOK && !slices.Contains(KernelDTypes, a.DType) {
				d.errorf(at.path.key("dtype"), "unknown dtype %q (want %s)", a.DType, strings.Join(KernelDTypes, ", "))
				dtOK = false
			}
			if a.Dir, dirOK = at.str("dir", "", true); dirOK && !slices.Contains(KernelDirs, a.Dir) {
				d.errorf(at.path.key("dir"), "unknown direction %q (want in, out or inout)", a.Dir)
				dirOK = false
			}
			ok = ok && dtOK && dirOK
		} else if kindOK {
			for _, key := range []string{"dtype", "dir"} {
				if at.has(key) {
					d.errorf(at.path.key(key), "only a buffer argument has a %s (this one is %s scalar)", key, hw.WithArticle(a.Kind))
					ok = false
				}
			}
			a.Dir = "in"
		} else {
			// The kind is missing or unknown (reported): dtype and dir
			// are this table's keys whatever it was meant to be.
			at.has("dtype")
			at.has("dir")
		}
		at.finish()
		ok = ok && nameOK && kindOK
	}
	return ok
}

// vendorProgram reports whether name is a [[kernel]], and checks that
// dev's backend is one the kernel has a file for.
func (d *decoder) vendorProgram(p keyPath, name string, dev *Device, m *Manifest) bool {
	k := m.KernelNamed(name)
	if k == nil {
		return false
	}
	switch {
	case dev.Backend == BackendCUDA && dev.Engine == hw.EngineGPU && k.PTX == "":
		d.errorf(p, "kernel %q has no ptx: a session on a cuda GPU runs a kernel's PTX", name)
	case dev.Backend != BackendCUDA && k.Wasm == "":
		d.errorf(p, "kernel %q has no wasm: a session on a %s device runs a kernel's Wasm module", name, dev.Backend)
	case dev.Backend == BackendCUDA && dev.Engine != hw.EngineGPU:
		d.errorf(p, "kernel %q: the cuda host device (engine cpu) runs no vendor kernels", name)
	}
	return true
}

// builtinPrograms lists every program name a backend has built in; a
// vendor kernel may not take one of them.
func builtinPrograms() []string {
	names := append(sim.Kernels(), cuda.HostPrograms()...)
	for _, k := range cuda.KernelInfos() {
		names = append(names, k.Name)
	}
	return names
}
