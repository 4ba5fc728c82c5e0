package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/manifest"
)

func init() { commands["kernels"] = true }

// emuKernels are the built-in kernels of the guest SDK's emulator
// (guest-sdk/emu, a module the host does not import) outside the op
// library; the emulator also has every program of the op library (the sim
// kernels described with an exactness tier), through its generated copy.
// A test in that module checks this column of docs/kernels.md against
// emu.Builtins.
var emuKernels = []string{"argmax", "bias", "copy", "fill", "matmul", "mlp_forward", "noop", "relu", "saxpy"}

// cmdKernels prints the kernel reference.
func cmdKernels(args []string, stdout, stderr io.Writer) int {
	c := newCommand("kernels", "[flags]", "Print the kernels a stage may prepare by name: their arguments in order and\nwhich backends have them (a compact table; --markdown for docs/kernels.md).")
	c.nargs = 0
	markdown := c.fs.Bool("markdown", false, "print the full reference, docs/kernels.md")
	manifestPath := c.fs.String("manifest", "", "list the vendor kernels ([[kernel]]) of the manifest `FILE` instead, verified as check verifies them")
	if _, code := c.parse(args, stdout, stderr); code >= 0 {
		return code
	}
	if *manifestPath != "" {
		m, err := manifest.Load(*manifestPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitInvalid
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KERNEL\tENTRY\tFILES\tARGUMENTS")
		for i := range m.Kernels {
			k := &m.Kernels[i]
			var files []string
			if k.Wasm != "" {
				files = append(files, "wasm "+k.WasmSHA256[:12]+"…")
			}
			if k.PTX != "" {
				files = append(files, "ptx "+k.PTXSHA256[:12]+"…")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Name, k.Entry, strings.Join(files, ", "), vendorArgs(k))
		}
		tw.Flush()
		return exitOK
	}
	if *markdown {
		fmt.Fprint(stdout, kernelsDoc())
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KERNEL\tBACKENDS\tTIER\tARGUMENTS")
	for _, r := range kernelRows() {
		sig := "..."
		if r.info != nil && !r.info.Variadic && len(r.info.Args) == 0 {
			sig = "(none)"
		} else if r.info != nil && !r.info.Variadic {
			parts := make([]string, len(r.info.Args))
			for i, a := range r.info.Args {
				parts[i] = a.Name + " " + argType(a)
			}
			sig = strings.Join(parts, ", ")
		} else if r.info == nil {
			sig = "(not described)"
		}
		tier := "-"
		if r.info != nil && r.info.Tier != "" {
			tier = r.info.Tier
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.name, strings.Join(r.backends(), ","), tier, sig)
	}
	tw.Flush()
	return exitOK
}

// vendorArgs is a vendor kernel's arguments, compactly: "x f32[] in, n u32".
func vendorArgs(k *manifest.Kernel) string {
	parts := make([]string, len(k.Args))
	for i, a := range k.Spec().Args {
		parts[i] = a.Name + " " + argType(a)
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

// vendorKernelSummary is check's line for a [[kernel]].
func vendorKernelSummary(k *manifest.Kernel) string {
	var files []string
	if k.Wasm != "" {
		files = append(files, "wasm sha256 "+k.WasmSHA256[:12]+"… ok")
	}
	if k.PTX != "" {
		files = append(files, "ptx sha256 "+k.PTXSHA256[:12]+"… ok")
	}
	return "entry " + k.Entry + " (" + vendorArgs(k) + "); " + strings.Join(files, "; ")
}

// argType is a compact type: "f32[] in" for a buffer, "u32" for a scalar.
func argType(a hw.KernelArg) string {
	if a.Kind == hw.KindBuffer {
		return a.Type + "[] " + a.Dir
	}
	return a.Type
}

// kernelRow is one kernel across the backends.
type kernelRow struct {
	name         string
	info         *hw.KernelInfo // the sim's description, else cuda's; nil if neither
	sim, simBare bool           // in the sim registry; registered without a description
	cuda, emu    bool
}

func (r kernelRow) backends() []string {
	var b []string
	if r.sim {
		b = append(b, "sim")
	}
	if r.cuda {
		b = append(b, "cuda")
	}
	if r.emu {
		b = append(b, "emu")
	}
	return b
}

// kernelRows joins the registries, sorted by name.
func kernelRows() []kernelRow {
	rows := map[string]*kernelRow{}
	row := func(n string) *kernelRow {
		if rows[n] == nil {
			rows[n] = &kernelRow{name: n}
		}
		return rows[n]
	}
	for _, n := range sim.Kernels() {
		r := row(n)
		r.sim, r.simBare = true, true
	}
	for _, k := range sim.KernelInfos() {
		r := row(k.Name)
		r.info, r.simBare = &k, false
		if k.Tier != "" {
			r.emu = true // the op library
		}
	}
	for _, k := range cuda.KernelInfos() {
		r := row(k.Name)
		r.cuda = true
		if r.info == nil {
			r.info = &k
		}
	}
	for _, n := range emuKernels {
		row(n).emu = true
	}
	var out []kernelRow
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b kernelRow) int { return strings.Compare(a.name, b.name) })
	return out
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// kernelsDoc renders docs/kernels.md from the registries.
func kernelsDoc() string {
	var b strings.Builder
	b.WriteString(`# Kernel reference

<!-- Generated from the registries of hw/sim and hw/cuda by
     go test ./cmd/stagehost -run TestKernelsDocIsCurrent -update
     (or stagehost kernels --markdown). Do not edit. -->

The programs a stage prepares by name (a session's ` + "`programs`" + `) and
launches with arguments in order. A buffer argument is a range of a
buffer (offset and length); ` + "`f32`" + ` ranges hold native-order float32
values, 4-byte aligned and a whole number of them; ` + "`bytes`" + ` ranges any
bytes. Matrices are row-major. A scalar ` + "`u32`" + ` must be below 2^32; an ` + "`f32`" + `
scalar is the float32 bits in the low 32 bits. A launch whose arguments
do not fit fails with InvalidArgument (at submit on cuda, and on sim and
emu for the op library's programs; when the kernel runs for the other sim
kernels). Arithmetic is float32 in a fixed order, never fused, so sim
and cuda results are bit-identical.

The op library (the kernels with a tier below) names a program ` + "`OP`" + ` for
float32 storage, ` + "`OP.f16`" + ` or ` + "`OP.bf16`" + ` for half storage (each value
converted to float32, computed in float32, rounded back once to the
storage type, to nearest even) and ` + "`OP.fast`" + ` (` + "`gemm.fast`" + `,
` + "`gemm.bf16.fast`" + `, ` + "`conv2d.fast`" + `) for the fast tier. ` + "`f16`" + ` and ` + "`bf16`" + `
ranges hold 2-byte halves, 2-byte aligned; ` + "`i32`" + ` ranges native-order int32.
Tiers: **exact**, bit-identical on sim, cuda and emu (NaN payloads
excepted); **bounded**, within the stated error of the float64 result;
**fast**, within the stated relative error (cuBLAS on cuda, the exact
implementation on sim and emu). Every reduction uses one fixed order:
lane t of 256 starts from the identity (0, or -Inf for a max) and
accumulates elements t, t+256, … in order; then for s = 128, 64, …, 1,
p[t] = p[t] + p[t+s] for t < s; the result is p[0]. Every dimension is 1 to
2^31-1 and every buffer at most 2^31-1 values; outputs never partially
overlap inputs.

Backends: **sim** is hw/sim, **cuda** hw/cuda, **emu** the guest SDK's
emulator (guest-sdk/emu), for testing guests without a host.

| kernel | sim | cuda | emu |
|---|---|---|---|
`)
	rows := kernelRows()
	for _, r := range rows {
		s := yes(r.sim)
		if r.simBare {
			s = "yes¹"
		}
		fmt.Fprintf(&b, "| [%s](#%s) | %s | %s | %s |\n", r.name, strings.ReplaceAll(r.name, ".", ""), s, yes(r.cuda), yes(r.emu))
	}
	b.WriteString("\n¹ On sim, registered by package sessions/exchange without a description; the arguments shown are cuda's where cuda has the kernel.\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "\n## %s\n\n", r.name)
		if r.info == nil {
			fmt.Fprintf(&b, "Not described: registered on sim by package sessions/exchange. Backends: %s.\n", strings.Join(r.backends(), ", "))
			continue
		}
		fmt.Fprintf(&b, "%s\n\n", r.info.Doc)
		if r.info.Variadic {
			b.WriteString("Arguments: any number, of either kind; all ignored.\n\n")
		} else if len(r.info.Args) == 0 {
			b.WriteString("Arguments: none.\n\n")
		} else {
			b.WriteString("| # | argument | kind | type | dir | length |\n|---|---|---|---|---|---|\n")
			for i, a := range r.info.Args {
				l := a.Len
				if l == "" {
					l = "any"
					if a.Kind == hw.KindScalar {
						l = "–"
					}
				}
				fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s | %s |\n", i, a.Name, a.Kind, a.Type, a.Dir, l)
			}
			b.WriteString("\n")
		}
		for _, c := range r.info.Constraints {
			fmt.Fprintf(&b, "- %s\n", c)
		}
		if len(r.info.Constraints) > 0 {
			b.WriteString("\n")
		}
		if r.info.Tier != "" {
			fmt.Fprintf(&b, "Tier: **%s**. %s\n\n", r.info.Tier, r.info.Exactness)
		}
		fmt.Fprintf(&b, "Backends: %s.\n", strings.Join(r.backends(), ", "))
	}
	return b.String()
}

// checkVendorPTX verifies every [[kernel]]'s PTX against the CUDA
// driver when there is one: compiled to a cubin in the internal-jit
// child under its jit_timeout (cached as the deployment caches it), then
// loaded on cuda0 with its parameter layout checked against the args and
// its resources against max_local_memory and the device (printed: its
// registers, local and static shared memory).
// Without a driver it says so and passes. It reports false when a PTX is
// refused.
func checkVendorPTX(m *manifest.Manifest, stdout, stderr io.Writer) bool {
	var ptx []*manifest.Kernel
	for i := range m.Kernels {
		if m.Kernels[i].PTX != "" {
			ptx = append(ptx, &m.Kernels[i])
		}
	}
	if len(ptx) == 0 {
		return true
	}
	p, err := cuda.Open(cuda.NewConfig().WithBLASLibrary("-"))
	if err != nil {
		fmt.Fprintf(stdout, "  note: vendor PTX not verified against a driver here (%v)\n", err)
		return true
	}
	defer p.Close()
	dev := p.Devices()[0].(*cuda.Device)
	ok := true
	for _, k := range ptx {
		var res cuda.KernelResources
		src, err := manifest.ReadFile(k.PTXFile, m.Runtime.MaxModuleSize)
		if err == nil {
			var cubin []byte
			cubin, _, err = cuda.CompilePTX(context.Background(), cuda.JITConfig{CacheDir: deploy.CacheDir(m), Timeout: k.JITTimeout,
				ComputeCapability: dev.ComputeCapability(), DriverVersion: int32(p.DriverVersion())}, k.Name, src)
			if err == nil {
				params := make([]cuda.ParamDecl, len(k.Args))
				for i, a := range k.Args {
					params[i] = cuda.ParamDecl{Name: a.Name, Size: cuda.ParamSize(a.Kind)}
				}
				res, err = dev.CheckVendor(cubin, k.PTX, k.Entry, params, k.VendorLimits())
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: kernel %q: %s\n", m.Path, k.Name, cuda.MapJITLog(err.Error(), k.PTX))
			ok = false
			continue
		}
		fmt.Fprintf(stdout, "  kernel %-12s ptx verified on %s (compute capability %s): entry %s, %d parameters as declared, %s\n", k.Name, dev.Name(), dev.ComputeCapability(), k.Entry, len(k.Args), res)
	}
	return ok
}
