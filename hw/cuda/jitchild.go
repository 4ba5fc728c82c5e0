package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/stagehost/stagehost/errdefs"
)

// CU_JIT_INPUT_PTX (cuda.h, CUjitInputType).
const cuJITInputPTX = 1

// RunJIT is the child side of [CompilePTX], what `stagehost
// internal-jit` runs: it links ptx for device 0 of the driver at the
// default library path (cuLinkCreate, cuLinkAddData, cuLinkComplete) and
// writes the cubin to out. On failure the error holds the JIT log.
//
// # Errors
//
// [errdefs.ErrUnsupported] without a usable driver or device;
// [errdefs.ErrInvalidArgument] when the PTX does not link.
func RunJIT(ptx []byte, out string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lib, err := openLibrary(defaultLibrary)
	if err != nil {
		return err
	}
	handle, err := purego.Dlopen(defaultLibrary, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %v", err)
	}
	syms := map[string]uintptr{}
	for _, name := range []string{"cuLinkCreate_v2", "cuLinkAddData_v2", "cuLinkComplete", "cuLinkDestroy"} {
		addr, err := purego.Dlsym(handle, name)
		if err != nil || addr == 0 {
			return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: libcuda lacks %s", name)
		}
		syms[name] = addr
	}
	fail := func(call string, r cuResult) error {
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: %s", call, resultString(lib, r))
	}
	if r := lib.Init(); r != cudaSuccess {
		return fail("cuInit", r)
	}
	dev, r := lib.DeviceGet(0)
	if r != cudaSuccess {
		return fail("cuDeviceGet", r)
	}
	ctx, r := lib.DevicePrimaryCtxRetain(dev)
	if r != cudaSuccess {
		return fail("cuDevicePrimaryCtxRetain", r)
	}
	defer lib.DevicePrimaryCtxRelease(dev)
	if r := lib.CtxSetCurrent(ctx); r != cudaSuccess {
		return fail("cuCtxSetCurrent", r)
	}
	logBuf := make([]byte, 64<<10)
	var pin runtime.Pinner
	pin.Pin(&logBuf[0])
	defer pin.Unpin()
	opts := [2]int32{cuJITErrorLogBuffer, cuJITErrorLogBufferSize}
	vals := [2]uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
	var state uintptr
	rr, _, _ := purego.SyscallN(syms["cuLinkCreate_v2"], 2, uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])), uintptr(unsafe.Pointer(&state)))
	if r := res(rr); r != cudaSuccess {
		return fail("cuLinkCreate", r)
	}
	defer purego.SyscallN(syms["cuLinkDestroy"], state)
	image := append(append(make([]byte, 0, len(ptx)+1), ptx...), 0)
	name := []byte("vendor.ptx\x00")
	rr, _, _ = purego.SyscallN(syms["cuLinkAddData_v2"], state, cuJITInputPTX, uintptr(unsafe.Pointer(&image[0])), uintptr(len(image)), uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
	runtime.KeepAlive(image)
	runtime.KeepAlive(name)
	if r := res(rr); r != cudaSuccess {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuLinkAddData: %s: %s", resultString(lib, r), jitLog(logBuf))
	}
	var cubin unsafe.Pointer
	var size uintptr
	rr, _, _ = purego.SyscallN(syms["cuLinkComplete"], state, uintptr(unsafe.Pointer(&cubin)), uintptr(unsafe.Pointer(&size)))
	if r := res(rr); r != cudaSuccess {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "cuLinkComplete: %s: %s", resultString(lib, r), jitLog(logBuf))
	}
	// The cubin belongs to the link state: copy it before cuLinkDestroy.
	data := append([]byte(nil), unsafe.Slice((*byte)(cubin), size)...)
	runtime.KeepAlive(&opts)
	runtime.KeepAlive(&vals)
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return fmt.Errorf("internal-jit: %w", err)
	}
	return nil
}

func jitLog(b []byte) string {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}
