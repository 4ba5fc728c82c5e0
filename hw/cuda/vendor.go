package cuda

import (
	"fmt"
	"math/bits"
	"regexp"
	"runtime"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Vendor kernels: PTX a manifest ships ([[kernel]] ptx), verified against
// the driver before it serves (docs/gpu.md, "Vendor kernels").

// ParamDecl is one declared parameter of a vendor PTX kernel: its name
// and its size in bytes (8 for a buffer, which is passed as a device
// pointer, and for u64; 4 for u32, i32 and f32).
type ParamDecl struct {
	Name string
	Size uintptr
}

// ParamSize is the size of a declared argument's parameter: kind is
// "buffer", "u32", "i32", "f32" or "u64".
func ParamSize(kind string) uintptr {
	switch kind {
	case "u32", "i32", "f32":
		return 4
	}
	return 8
}

// Device attributes (cuda.h, CUdevice_attribute).
const (
	attrMaxThreadsPerBlock = 1
	attrMaxBlockDimX       = 2
	attrMaxGridDimX        = 5
	attrMaxSharedPerBlock  = 8
	attrMultiprocessors    = 16 // MULTIPROCESSOR_COUNT
	attrMaxThreadsPerSM    = 39 // MAX_THREADS_PER_MULTIPROCESSOR
	attrCCMajor            = 75
	attrCCMinor            = 76
)

// Function attributes (cuda.h, CUfunction_attribute).
const (
	funcAttrMaxThreadsPerBlock = 0 // MAX_THREADS_PER_BLOCK
	funcAttrSharedSizeBytes    = 1 // SHARED_SIZE_BYTES: static shared memory per block
	funcAttrLocalSizeBytes     = 3 // LOCAL_SIZE_BYTES: local memory per thread
	funcAttrNumRegs            = 4 // NUM_REGS
)

// DefaultMaxLocalMemory is [VendorLimits.MaxLocalMemory] of
// [DefaultVendorLimits]: 1 GiB.
const DefaultMaxLocalMemory = 1 << 30

// VendorLimits bounds what a vendor kernel may take of its device beyond
// its launches' own shapes. [DefaultVendorLimits] holds the defaults.
type VendorLimits struct {
	// MaxLocalMemory bounds the kernel's worst-case local memory
	// reservation on the device, in bytes: its local memory per thread
	// (.local arrays, spills) × the device's multiprocessors × the most
	// threads resident on one multiprocessor. The driver reserves local
	// memory for every thread that can be resident on the device, not
	// for the launch's threads, and that memory is taken from the GPU all
	// processes share. 0 admits only kernels without local memory.
	MaxLocalMemory uint64
}

// DefaultVendorLimits are the limits [Device.VerifyPTX] and
// [Device.PrepareVendor] apply: MaxLocalMemory [DefaultMaxLocalMemory].
var DefaultVendorLimits = VendorLimits{MaxLocalMemory: DefaultMaxLocalMemory}

// KernelResources is what the driver says a loaded vendor kernel needs
// (cuFuncGetAttribute) and the device attributes its local memory
// reservation is sized by (cuDeviceGetAttribute).
type KernelResources struct {
	Registers          int    // NUM_REGS, per thread
	LocalBytes         uint64 // LOCAL_SIZE_BYTES, per thread
	StaticSharedBytes  uint64 // SHARED_SIZE_BYTES, per block (dynamic shared memory comes with each launch)
	MaxThreadsPerBlock int    // MAX_THREADS_PER_BLOCK for this kernel on this device

	Multiprocessors          uint64 // the device's MULTIPROCESSOR_COUNT
	ThreadsPerMultiprocessor uint64 // the device's MAX_THREADS_PER_MULTIPROCESSOR
}

// ResidentThreads is the most threads resident on the device at once:
// multiprocessors × threads per multiprocessor (270,336 on an H200).
func (r KernelResources) ResidentThreads() uint64 {
	return satMul(r.Multiprocessors, r.ThreadsPerMultiprocessor)
}

// LocalReservation is the kernel's worst-case local memory reservation
// on the device: LocalBytes × ResidentThreads (saturating at 2^64-1).
func (r KernelResources) LocalReservation() uint64 {
	return satMul(r.LocalBytes, r.ResidentThreads())
}

// String gives the attributes as `stagehost check` prints them: "16
// registers, 0 B local, 0 B static shared".
func (r KernelResources) String() string {
	return fmt.Sprintf("%d registers, %d B local, %d B static shared", r.Registers, r.LocalBytes, r.StaticSharedBytes)
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return ^uint64(0)
	}
	return lo
}

var _ hw.LaunchLimiter = (*Device)(nil)

// LaunchLimits reads the device's launch limits with cuDeviceGetAttribute
// (MAX_THREADS_PER_BLOCK, MAX_BLOCK_DIM_X/Y/Z, MAX_GRID_DIM_X/Y/Z,
// MAX_SHARED_MEMORY_PER_BLOCK). Where the driver does not give one, the
// limit of [hw.DefaultLaunchLimits] stands. They are read once.
func (d *Device) LaunchLimits() hw.LaunchLimits {
	d.limitsOnce.Do(func() { d.limits = d.readLaunchLimits() })
	return d.limits
}

func (d *Device) readLaunchLimits() hw.LaunchLimits {
	l := hw.DefaultLaunchLimits
	get := func(attr int32, dst *uint32) {
		if v, r := d.drv.DeviceGetAttribute(attr, d.dev); r == cudaSuccess && v > 0 {
			*dst = uint32(v)
		}
	}
	get(attrMaxThreadsPerBlock, &l.MaxThreadsPerBlock)
	for i := range int32(3) {
		get(attrMaxBlockDimX+i, &l.MaxBlock[i])
		get(attrMaxGridDimX+i, &l.MaxGrid[i])
	}
	get(attrMaxSharedPerBlock, &l.MaxSharedBytes)
	return l
}

// ComputeCapability returns the device's compute capability ("9.0"), or
// "" when the driver does not say.
func (d *Device) ComputeCapability() string {
	maj, r1 := d.drv.DeviceGetAttribute(attrCCMajor, d.dev)
	minor, r2 := d.drv.DeviceGetAttribute(attrCCMinor, d.dev)
	if r1 != cudaSuccess || r2 != cudaSuccess {
		return ""
	}
	return fmt.Sprintf("%d.%d", maj, minor)
}

// VerifyPTX is [Device.CheckVendor] with [DefaultVendorLimits], its
// resources dropped.
func (d *Device) VerifyPTX(image []byte, file, entry string, params []ParamDecl) error {
	_, err := d.CheckVendor(image, file, entry, params, DefaultVendorLimits)
	return err
}

// CheckVendor loads a vendor kernel's PTX (or cubin) on the device
// (JIT-compiling PTX in this thread: run it in a process of its own when
// the PTX is not trusted to compile quickly, docs/gpu.md), finds entry,
// checks the entry's parameter layout (cuFuncGetParamInfo) against
// params, their count and each one's size, and reads its resources
// (cuFuncGetAttribute), checking them against lim and the device: its
// worst-case local memory reservation ([KernelResources.LocalReservation])
// at most lim.MaxLocalMemory, its static shared memory at most the
// device's MAX_SHARED_MEMORY_PER_BLOCK. The module is unloaded again.
// A kernel refused over a limit comes with the resources read.
//
// # Errors
//
//   - [errdefs.ErrInvalidArgument]: the driver refuses the image (the
//     JIT log is included, its "line N" rewritten to file:N), it has no
//     entry, the layout does not match (naming the argument), a
//     cuFuncGetAttribute call fails, or the kernel's local memory
//     reservation or static shared memory is over its limit (naming the
//     file, the entry, the bytes per thread, the device's resident
//     threads, their product and the limit).
//   - [errdefs.ErrUnsupported]: the driver lacks cuFuncGetParamInfo, so
//     the layout cannot be checked (CUDA 12.4 and later have it), or
//     lacks cuFuncGetAttribute, or does not give the device's
//     multiprocessor count and threads per multiprocessor, so the local
//     memory cannot be bounded.
//   - [errdefs.ErrDeviceLost]: the device is lost.
func (d *Device) CheckVendor(image []byte, file, entry string, params []ParamDecl, lim VendorLimits) (KernelResources, error) {
	mod, _, res, err := d.loadVendor(image, file, entry, params, lim, "PTX")
	if err == nil {
		d.drv.ModuleUnload(mod)
	}
	return res, err
}

// loadVendor is the one load of a vendor kernel, of [Device.CheckVendor]
// and [Device.PrepareVendorLimits]: it loads image (what names it in the
// driver's refusal: "PTX" or "image") with the device's context current,
// finds entry, and checks its parameter layout against params and its
// resources against lim. On success the module stays loaded (the caller
// unloads or keeps it); on an error nothing stays loaded.
func (d *Device) loadVendor(image []byte, file, entry string, params []ParamDecl, lim VendorLimits, what string) (cuModule, cuFunction, KernelResources, error) {
	if err := d.usable(); err != nil {
		return 0, 0, KernelResources{}, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.drv.CtxSetCurrent(d.ctx); r != cudaSuccess {
		return 0, 0, KernelResources{}, d.resultErr("cuCtxSetCurrent", r)
	}
	if len(image) == 0 || image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0) // a copy: the caller's bytes stay as they are
	}
	mod, log, r := d.drv.ModuleLoadData(image)
	if r != cudaSuccess {
		msg := fmt.Sprintf("%s: the driver refuses the %s (%s)", file, what, d.drv.ErrorName(r))
		if log = MapJITLog(log, file); log != "" {
			msg += ":\n" + log
		}
		return 0, 0, KernelResources{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s", msg)
	}
	f, r := d.drv.ModuleGetFunction(mod, entry)
	if r != cudaSuccess {
		d.drv.ModuleUnload(mod)
		return 0, 0, KernelResources{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: no .entry %q (%s)", file, entry, d.drv.ErrorName(r))
	}
	if err := checkParamLayout(d.drv, f, file, entry, params); err != nil {
		d.drv.ModuleUnload(mod)
		return 0, 0, KernelResources{}, err
	}
	res, err := d.checkResources(f, file, entry, lim)
	if err != nil {
		d.drv.ModuleUnload(mod)
		return 0, 0, res, err
	}
	return mod, f, res, nil
}

// checkResources reads f's resources and checks them against lim and
// the device (as [Device.CheckVendor]).
func (d *Device) checkResources(f cuFunction, file, entry string, lim VendorLimits) (KernelResources, error) {
	var kr KernelResources
	for _, a := range []struct {
		attr int32
		name string
		set  func(int32)
	}{
		{funcAttrLocalSizeBytes, "LOCAL_SIZE_BYTES", func(v int32) { kr.LocalBytes = uint64(v) }},
		{funcAttrSharedSizeBytes, "SHARED_SIZE_BYTES", func(v int32) { kr.StaticSharedBytes = uint64(v) }},
		{funcAttrNumRegs, "NUM_REGS", func(v int32) { kr.Registers = int(v) }},
		{funcAttrMaxThreadsPerBlock, "MAX_THREADS_PER_BLOCK", func(v int32) { kr.MaxThreadsPerBlock = int(v) }},
	} {
		v, r := d.drv.FuncGetAttribute(a.attr, f)
		switch {
		case r == cudaErrorNotSupported:
			return KernelResources{}, errdefs.Errorf(errdefs.ErrUnsupported, "%s: .entry %s: the driver lacks cuFuncGetAttribute, so the kernel's local memory cannot be bounded", file, entry)
		case r.sticky():
			return KernelResources{}, d.resultErr("cuFuncGetAttribute", r)
		case r != cudaSuccess:
			return KernelResources{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: cuFuncGetAttribute(%s): %s", file, entry, a.name, d.drv.ErrorName(r))
		case v < 0:
			return KernelResources{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: cuFuncGetAttribute(%s) = %d", file, entry, a.name, v)
		}
		a.set(v)
	}
	sms, r1 := d.drv.DeviceGetAttribute(attrMultiprocessors, d.dev)
	perSM, r2 := d.drv.DeviceGetAttribute(attrMaxThreadsPerSM, d.dev)
	if r1 != cudaSuccess || r2 != cudaSuccess || sms <= 0 || perSM <= 0 {
		return KernelResources{}, errdefs.Errorf(errdefs.ErrUnsupported, "%s: .entry %s: the driver does not give %s's MULTIPROCESSOR_COUNT and MAX_THREADS_PER_MULTIPROCESSOR (%s, %s), so the kernel's local memory cannot be bounded",
			file, entry, d.name, d.drv.ErrorName(r1), d.drv.ErrorName(r2))
	}
	kr.Multiprocessors, kr.ThreadsPerMultiprocessor = uint64(sms), uint64(perSM)
	if got := kr.LocalReservation(); got > lim.MaxLocalMemory {
		return kr, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: %d bytes of local memory per thread × %d resident threads on %s (%d multiprocessors × %d) = %d bytes, over the limit of %d bytes (max_local_memory)",
			file, entry, kr.LocalBytes, kr.ResidentThreads(), d.name, sms, perSM, got, lim.MaxLocalMemory)
	}
	if limit := uint64(d.LaunchLimits().MaxSharedBytes); kr.StaticSharedBytes > limit {
		return kr, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: %d bytes of static shared memory per block, over %s's limit of %d bytes (MAX_SHARED_MEMORY_PER_BLOCK)",
			file, entry, kr.StaticSharedBytes, d.name, limit)
	}
	return kr, nil
}

// resultErr is the error of a driver call that failed.
func (d *Device) resultErr(call string, r cuResult) error {
	class := errdefs.ErrUnsupported
	if r.sticky() {
		class = errdefs.ErrDeviceLost
	}
	return errdefs.Errorf(class, "cuda: %s: %s: %s", d.name, call, d.drv.ErrorName(r))
}

// maxParamsChecked bounds the parameters checkParamLayout reads: more
// than any launch passes.
const maxParamsChecked = 64

// checkParamLayout compares f's parameters with the declaration.
func checkParamLayout(drv driver, f cuFunction, file, entry string, params []ParamDecl) error {
	var got [][2]uintptr // offset, size
	for i := range maxParamsChecked {
		off, size, r := drv.FuncGetParamInfo(f, i)
		if r == cudaErrorNotSupported {
			return errdefs.Errorf(errdefs.ErrUnsupported, "%s: .entry %s: the driver lacks cuFuncGetParamInfo (CUDA 12.4 or later), so its parameter layout cannot be checked against the declared args", file, entry)
		}
		if r == cudaErrorInvalidValue {
			break // past the last parameter
		}
		if r != cudaSuccess {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: cuFuncGetParamInfo(%d): %s", file, entry, i, drv.ErrorName(r))
		}
		got = append(got, [2]uintptr{off, size})
	}
	for i, p := range params {
		if i >= len(got) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s has %d parameters, the declaration %d: argument %d (%s) has no parameter", file, entry, len(got), len(params), i, p.Name)
		}
		if got[i][1] != p.Size {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s: parameter %d is %d bytes, but argument %d (%s) is declared with %d bytes", file, entry, i, got[i][1], i, p.Name, p.Size)
		}
	}
	if len(got) > len(params) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: .entry %s has %d parameters, the declaration %d: parameter %d (%d bytes at offset %d) is not declared", file, entry, len(got), len(params), len(params), got[len(params)][1], got[len(params)][0])
	}
	return nil
}

// jitLine matches the position ptxas gives in a JIT log.
var jitLine = regexp.MustCompile(`ptxas[^,\n]*, line (\d+); `)

// MapJITLog rewrites the positions of a PTX JIT log ("ptxas application
// ptx input, line 12; error   : …") to file:line ("kernels/x.ptx:12:
// error   : …"), and trims it.
func MapJITLog(log, file string) string {
	return strings.TrimSpace(jitLine.ReplaceAllString(log, file+":$1: "))
}

// PrepareVendor is [Device.PrepareVendorLimits] with
// [DefaultVendorLimits].
func (d *Device) PrepareVendor(image []byte, file, entry string, info hw.KernelInfo) (hw.Program, error) {
	return d.PrepareVendorLimits(image, file, entry, info, DefaultVendorLimits)
}

// PrepareVendorLimits loads a vendor kernel on the device, from its
// cubin ([CompilePTX]) or its PTX (JIT-compiled here, blocking this
// thread: serving processes load cubins), finds entry and checks its
// parameter layout against info's arguments and its resources against
// lim and the device (as [Device.CheckVendor]). Its launches
// take their grid, block and shared memory from [hw.Command.Shape],
// which they must have (stream_launch), and their arguments are checked
// against info: count, kinds, a buffer inside its allocation, a 32-bit
// scalar below 2^32. The module stays loaded until the device closes.
//
// # Errors
//
// As for [Device.CheckVendor].
func (d *Device) PrepareVendorLimits(image []byte, file, entry string, info hw.KernelInfo, lim VendorLimits) (hw.Program, error) {
	params := make([]ParamDecl, len(info.Args))
	for i, a := range info.Args {
		kind := a.Type
		if a.Kind == hw.KindBuffer {
			kind = "buffer"
		}
		params[i] = ParamDecl{Name: a.Name, Size: ParamSize(kind)}
	}
	mod, f, _, err := d.loadVendor(image, file, entry, params, lim, "image")
	if err != nil {
		return nil, err
	}
	d.vendorMu.Lock()
	d.vendorMods = append(d.vendorMods, mod)
	d.vendorMu.Unlock()
	return &program{dev: d, k: &kernel{name: info.Name}, fn: f, vendor: &info}, nil
}

// prepareVendorLaunch validates a vendor kernel's command and packs it.
func (d *Device) prepareVendorLaunch(prog *program, cmd *hw.Command, l *launch) error {
	k := prog.vendor
	if cmd.Shape == nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s is a vendor kernel: it is launched with a shape (stream_launch)", k.Name)
	}
	if err := d.LaunchLimits().Check(cmd.Shape); err != nil {
		return fmt.Errorf("cuda: %s: %w", k.Name, err)
	}
	if len(cmd.Args) != len(k.Args) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s takes %d arguments, got %d", k.Name, len(k.Args), len(cmd.Args))
	}
	for i, a := range cmd.Args {
		decl := k.Args[i]
		if (a.Buffer != nil) != (decl.Kind == hw.KindBuffer) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: argument %d (%s): the kind does not match its declaration (%s %s)", k.Name, i, decl.Name, decl.Kind, decl.Type)
		}
		if a.Buffer == nil {
			if decl.Type != "u64" && a.Value>>32 != 0 {
				return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuda: %s: argument %d (%s): %#x does not fit %s", k.Name, i, decl.Name, a.Value, hw.WithArticle(decl.Type))
			}
			l.params[i] = a.Value
			continue
		}
		buf, err := d.bufferOf(a.Buffer, i)
		if err != nil {
			return err
		}
		if err := checkRange(i, a.Offset, a.Length, buf.size); err != nil {
			return err
		}
		l.params[i] = uint64(buf.ptr) + uint64(a.Offset)
	}
	l.fn, l.nparams = prog.fn, len(cmd.Args)
	l.grid, l.block, l.shared = cmd.Shape.Grid, cmd.Shape.Block, cmd.Shape.SharedBytes
	l.blas, l.dtype = false, 0
	return nil
}
