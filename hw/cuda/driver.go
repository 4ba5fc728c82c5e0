package cuda

import (
	"fmt"
	"unsafe"
)

// The CUDA driver API's handle types. They are opaque C values, never Go
// pointers, so uintptr is the right representation.
type (
	cuResult    int32
	cuDevice    int32
	cuContext   uintptr
	cuModule    uintptr
	cuFunction  uintptr
	cuStream    uintptr
	cuEvent     uintptr
	cuGraph     uintptr
	cuGraphExec uintptr
	cuDevicePtr uint64
)

// CUresult values this package tells apart (cuda.h).
const (
	cudaSuccess                   cuResult = 0
	cudaErrorInvalidValue         cuResult = 1
	cudaErrorOutOfMemory          cuResult = 2
	cudaErrorNotInitialized       cuResult = 3
	cudaErrorDeinitialized        cuResult = 4
	cudaErrorStubLibrary          cuResult = 34
	cudaErrorDeviceUnavailable    cuResult = 46
	cudaErrorNoDevice             cuResult = 100
	cudaErrorInvalidDevice        cuResult = 101
	cudaErrorInvalidImage         cuResult = 200
	cudaErrorInvalidContext       cuResult = 201
	cudaErrorEccUncorrectable     cuResult = 214
	cudaErrorInvalidPTX           cuResult = 218
	cudaErrorNvlinkUncorrectable  cuResult = 220
	cudaErrorUnsupportedPTX       cuResult = 222
	cudaErrorInvalidHandle        cuResult = 400
	cudaErrorNotFound             cuResult = 500
	cudaErrorNotReady             cuResult = 600
	cudaErrorIllegalAddress       cuResult = 700
	cudaErrorLaunchOutOfResources cuResult = 701
	cudaErrorLaunchTimeout        cuResult = 702
	cudaErrorContextIsDestroyed   cuResult = 709
	cudaErrorAssert               cuResult = 710
	cudaErrorHardwareStackError   cuResult = 714
	cudaErrorIllegalInstruction   cuResult = 715
	cudaErrorMisalignedAddress    cuResult = 716
	cudaErrorInvalidAddressSpace  cuResult = 717
	cudaErrorInvalidPC            cuResult = 718
	cudaErrorLaunchFailed         cuResult = 719
	cudaErrorNotPermitted         cuResult = 800
	cudaErrorNotSupported         cuResult = 801
	cudaErrorSystemDriverMismatch cuResult = 803
	cudaErrorUnknown              cuResult = 999
)

// Flags and modes (cuda.h).
const (
	cuMemHostAllocPortable      = 0x01
	cuMemHostAllocDeviceMap     = 0x02
	cuStreamNonBlocking         = 0x1
	cuEventDisableTiming        = 0x2
	cuStreamCaptureModeThreadLo = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
	cuJITErrorLogBuffer         = 5 // CU_JIT_ERROR_LOG_BUFFER
	cuJITErrorLogBufferSize     = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)

// fallbackNames names results when cuGetErrorName cannot (or in tests).
var fallbackNames = map[cuResult]string{
	cudaSuccess:                   "CUDA_SUCCESS",
	cudaErrorInvalidValue:         "CUDA_ERROR_INVALID_VALUE",
	cudaErrorOutOfMemory:          "CUDA_ERROR_OUT_OF_MEMORY",
	cudaErrorNotInitialized:       "CUDA_ERROR_NOT_INITIALIZED",
	cudaErrorDeinitialized:        "CUDA_ERROR_DEINITIALIZED",
	cudaErrorStubLibrary:          "CUDA_ERROR_STUB_LIBRARY",
	cudaErrorDeviceUnavailable:    "CUDA_ERROR_DEVICE_UNAVAILABLE",
	cudaErrorNoDevice:             "CUDA_ERROR_NO_DEVICE",
	cudaErrorInvalidDevice:        "CUDA_ERROR_INVALID_DEVICE",
	cudaErrorInvalidImage:         "CUDA_ERROR_INVALID_IMAGE",
	cudaErrorInvalidContext:       "CUDA_ERROR_INVALID_CONTEXT",
	cudaErrorEccUncorrectable:     "CUDA_ERROR_ECC_UNCORRECTABLE",
	cudaErrorInvalidPTX:           "CUDA_ERROR_INVALID_PTX",
	cudaErrorNvlinkUncorrectable:  "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	cudaErrorUnsupportedPTX:       "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	cudaErrorInvalidHandle:        "CUDA_ERROR_INVALID_HANDLE",
	cudaErrorNotFound:             "CUDA_ERROR_NOT_FOUND",
	cudaErrorNotReady:             "CUDA_ERROR_NOT_READY",
	cudaErrorIllegalAddress:       "CUDA_ERROR_ILLEGAL_ADDRESS",
	cudaErrorLaunchOutOfResources: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	cudaErrorLaunchTimeout:        "CUDA_ERROR_LAUNCH_TIMEOUT",
	cudaErrorContextIsDestroyed:   "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	cudaErrorAssert:               "CUDA_ERROR_ASSERT",
	cudaErrorHardwareStackError:   "CUDA_ERROR_HARDWARE_STACK_ERROR",
	cudaErrorIllegalInstruction:   "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	cudaErrorMisalignedAddress:    "CUDA_ERROR_MISALIGNED_ADDRESS",
	cudaErrorInvalidAddressSpace:  "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	cudaErrorInvalidPC:            "CUDA_ERROR_INVALID_PC",
	cudaErrorLaunchFailed:         "CUDA_ERROR_LAUNCH_FAILED",
	cudaErrorNotPermitted:         "CUDA_ERROR_NOT_PERMITTED",
	cudaErrorNotSupported:         "CUDA_ERROR_NOT_SUPPORTED",
	cudaErrorSystemDriverMismatch: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	cudaErrorUnknown:              "CUDA_ERROR_UNKNOWN",
}

// sticky reports whether r poisons the whole context: after it, every
// call on the context fails, so the device is lost for this process.
func (r cuResult) sticky() bool {
	switch r {
	case cudaErrorDeinitialized, cudaErrorDeviceUnavailable,
		cudaErrorEccUncorrectable, cudaErrorNvlinkUncorrectable,
		cudaErrorIllegalAddress, cudaErrorLaunchTimeout,
		cudaErrorContextIsDestroyed, cudaErrorAssert,
		cudaErrorHardwareStackError, cudaErrorIllegalInstruction,
		cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
		cudaErrorInvalidPC, cudaErrorLaunchFailed, cudaErrorUnknown:
		return true
	}
	return false
}

// maxParams is the most kernel parameters one launch passes: the user's
// arguments plus the counts the host appends.
const maxParams = 20

// paramBlock is the stable memory cuLaunchKernel reads its parameters
// from: ptrs[i] points at vals[i] (the void** kernelParams array). Each
// stream owns one, allocated and pinned (runtime.Pinner) once, so the
// memory C reads never moves and holds only pinned pointers.
type paramBlock struct {
	ptrs [maxParams]unsafe.Pointer
	vals [maxParams]uint64
}

func (p *paramBlock) init() {
	for i := range p.ptrs {
		p.ptrs[i] = unsafe.Pointer(&p.vals[i])
	}
}

// driver is the seam between this package and the CUDA driver API: one Go
// method per driver entry point this package uses, with C out-parameters
// turned into results. libDriver implements it over libcuda.so.1 with
// purego; tests use a fake. Every method that needs a current context
// expects its caller to have made one current on the calling OS thread.
type driver interface {
	Init() cuResult
	DriverGetVersion() (int32, cuResult)
	DeviceGetCount() (int32, cuResult)
	DeviceGet(ordinal int32) (cuDevice, cuResult)
	DeviceGetName(dev cuDevice) (string, cuResult)
	DevicePrimaryCtxRetain(dev cuDevice) (cuContext, cuResult)
	DevicePrimaryCtxRelease(dev cuDevice) cuResult
	// DevicePrimaryCtxReset destroys the primary context's state (optional
	// symbol; CUDA_ERROR_NOT_SUPPORTED without it).
	DevicePrimaryCtxReset(dev cuDevice) cuResult
	CtxSetCurrent(ctx cuContext) cuResult

	MemAlloc(size uintptr) (cuDevicePtr, cuResult)
	MemFree(p cuDevicePtr) cuResult
	// MemsetD8 fills device memory synchronously (new buffers start zeroed).
	MemsetD8(p cuDevicePtr, v uint8, n uintptr) cuResult
	MemHostAlloc(size uintptr, flags uint32) (unsafe.Pointer, cuResult)
	MemHostGetDevicePointer(host unsafe.Pointer) (cuDevicePtr, cuResult)
	MemFreeHost(host unsafe.Pointer) cuResult
	MemcpyHtoDAsync(dst cuDevicePtr, src unsafe.Pointer, n uintptr, s cuStream) cuResult
	MemcpyDtoHAsync(dst unsafe.Pointer, src cuDevicePtr, n uintptr, s cuStream) cuResult

	StreamCreate(flags uint32) (cuStream, cuResult)
	StreamDestroy(s cuStream) cuResult
	StreamQuery(s cuStream) cuResult
	StreamSynchronize(s cuStream) cuResult
	EventCreate(flags uint32) (cuEvent, cuResult)
	EventRecord(e cuEvent, s cuStream) cuResult
	EventQuery(e cuEvent) cuResult
	EventDestroy(e cuEvent) cuResult

	// ModuleLoadData loads a NUL-terminated PTX image eagerly and returns
	// the JIT error log on failure.
	ModuleLoadData(image []byte) (cuModule, string, cuResult)
	ModuleUnload(m cuModule) cuResult
	// FuncGetParamInfo gives parameter index's offset and size
	// (cuFuncGetParamInfo, an optional symbol: CUDA_ERROR_NOT_SUPPORTED
	// without it; CUDA_ERROR_INVALID_VALUE past the last parameter).
	FuncGetParamInfo(f cuFunction, index int) (offset, size uintptr, r cuResult)
	// DeviceGetAttribute reads a device attribute (cuDeviceGetAttribute,
	// optional here: CUDA_ERROR_NOT_SUPPORTED without it).
	DeviceGetAttribute(attr int32, dev cuDevice) (int32, cuResult)
	// FuncGetAttribute reads a loaded function's attribute
	// (cuFuncGetAttribute, optional here: CUDA_ERROR_NOT_SUPPORTED
	// without it).
	FuncGetAttribute(attr int32, f cuFunction) (int32, cuResult)
	ModuleGetFunction(m cuModule, name string) (cuFunction, cuResult)
	// LaunchKernel passes p.ptrs[:n] as kernelParams (nil when n is 0).
	LaunchKernel(f cuFunction, grid, block [3]uint32, sharedMem uint32, s cuStream, p *paramBlock, n int) cuResult

	// Graphs (optional symbols: HasGraphs reports whether they loaded).
	HasGraphs() bool
	StreamBeginCapture(s cuStream, mode uint32) cuResult
	StreamEndCapture(s cuStream) (cuGraph, cuResult)
	GraphInstantiate(g cuGraph) (cuGraphExec, cuResult)
	GraphLaunch(g cuGraphExec, s cuStream) cuResult
	GraphExecDestroy(g cuGraphExec) cuResult
	GraphDestroy(g cuGraph) cuResult

	// ErrorName names a result ("CUDA_ERROR_ILLEGAL_ADDRESS").
	ErrorName(r cuResult) string
}

// resultString formats a result for messages: "CUDA_ERROR_X (n)".
func resultString(d driver, r cuResult) string {
	name := ""
	if d != nil {
		name = d.ErrorName(r)
	}
	if name == "" {
		name = fallbackNames[r]
	}
	if name == "" {
		name = "CUDA_ERROR"
	}
	return fmt.Sprintf("%s (%d)", name, int32(r))
}
