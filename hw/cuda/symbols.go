package cuda

import (
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/stagehost/stagehost/errdefs"
)

// symbols is the symbol table: one field per driver entry point, holding
// its address in libcuda. The tag names the exact, versioned symbol
// (the _v2 names where the driver has them); ",optional" marks symbols
// whose absence only disables a feature. loadSymbols fills every field
// and reports every missing symbol at once.
type symbols struct {
	cuInit                      uintptr `cuda:"cuInit"`
	cuDriverGetVersion          uintptr `cuda:"cuDriverGetVersion"`
	cuDeviceGetCount            uintptr `cuda:"cuDeviceGetCount"`
	cuDeviceGet                 uintptr `cuda:"cuDeviceGet"`
	cuDeviceGetName             uintptr `cuda:"cuDeviceGetName"`
	cuDevicePrimaryCtxRetain    uintptr `cuda:"cuDevicePrimaryCtxRetain"`
	cuDevicePrimaryCtxRelease   uintptr `cuda:"cuDevicePrimaryCtxRelease_v2"`
	cuCtxSetCurrent             uintptr `cuda:"cuCtxSetCurrent"`
	cuMemAlloc                  uintptr `cuda:"cuMemAlloc_v2"`
	cuMemFree                   uintptr `cuda:"cuMemFree_v2"`
	cuMemsetD8                  uintptr `cuda:"cuMemsetD8_v2"`
	cuMemHostAlloc              uintptr `cuda:"cuMemHostAlloc"`
	cuMemHostGetDevicePointer   uintptr `cuda:"cuMemHostGetDevicePointer_v2"`
	cuMemFreeHost               uintptr `cuda:"cuMemFreeHost"`
	cuMemcpyHtoDAsync           uintptr `cuda:"cuMemcpyHtoDAsync_v2"`
	cuMemcpyDtoHAsync           uintptr `cuda:"cuMemcpyDtoHAsync_v2"`
	cuStreamCreate              uintptr `cuda:"cuStreamCreate"`
	cuStreamDestroy             uintptr `cuda:"cuStreamDestroy_v2"`
	cuStreamQuery               uintptr `cuda:"cuStreamQuery"`
	cuStreamSynchronize         uintptr `cuda:"cuStreamSynchronize"`
	cuEventCreate               uintptr `cuda:"cuEventCreate"`
	cuEventRecord               uintptr `cuda:"cuEventRecord"`
	cuEventQuery                uintptr `cuda:"cuEventQuery"`
	cuEventDestroy              uintptr `cuda:"cuEventDestroy_v2"`
	cuModuleLoadDataEx          uintptr `cuda:"cuModuleLoadDataEx"`
	cuModuleUnload              uintptr `cuda:"cuModuleUnload"`
	cuModuleGetFunction         uintptr `cuda:"cuModuleGetFunction"`
	cuLaunchKernel              uintptr `cuda:"cuLaunchKernel"`
	cuGetErrorName              uintptr `cuda:"cuGetErrorName"`
	cuStreamBeginCapture        uintptr `cuda:"cuStreamBeginCapture_v2,optional"`
	cuStreamEndCapture          uintptr `cuda:"cuStreamEndCapture,optional"`
	cuGraphInstantiateWithFlags uintptr `cuda:"cuGraphInstantiateWithFlags,optional"`
	cuGraphLaunch               uintptr `cuda:"cuGraphLaunch,optional"`
	cuGraphExecDestroy          uintptr `cuda:"cuGraphExecDestroy,optional"`
	cuGraphDestroy              uintptr `cuda:"cuGraphDestroy,optional"`
	cuDevicePrimaryCtxReset     uintptr `cuda:"cuDevicePrimaryCtxReset_v2,optional"`
	cuFuncGetParamInfo          uintptr `cuda:"cuFuncGetParamInfo,optional"`
	cuDeviceGetAttribute        uintptr `cuda:"cuDeviceGetAttribute,optional"`
	cuFuncGetAttribute          uintptr `cuda:"cuFuncGetAttribute,optional"`
	missingOptional             []string
	graphsLoaded                bool
}

// symbolLookup resolves one symbol name to its address (0 or an error when
// absent). The real one wraps purego.Dlsym; tests pass fakes.
type symbolLookup func(name string) (uintptr, error)

// loadSymbols fills a symbol table through lookup. It tries every symbol
// and, when required ones are missing, returns one [errdefs.ErrUnsupported]
// error that names all of them.
func loadSymbols(lookup symbolLookup) (*symbols, error) {
	s := new(symbols)
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	var missing []string
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("cuda")
		if !ok {
			continue
		}
		name, optional := strings.CutSuffix(tag, ",optional")
		addr, err := lookup(name)
		if err != nil || addr == 0 {
			if optional {
				s.missingOptional = append(s.missingOptional, name)
			} else {
				missing = append(missing, name)
			}
			continue
		}
		// The fields are unexported: write through their address.
		*(*uintptr)(unsafe.Pointer(v.Field(i).UnsafeAddr())) = addr
	}
	if len(missing) > 0 {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: libcuda lacks %d required symbol(s): %s (driver too old?)",
			len(missing), strings.Join(missing, ", "))
	}
	s.graphsLoaded = s.cuStreamBeginCapture != 0 && s.cuStreamEndCapture != 0 && s.cuGraphInstantiateWithFlags != 0 &&
		s.cuGraphLaunch != 0 && s.cuGraphExecDestroy != 0 && s.cuGraphDestroy != 0
	return s, nil
}

// libDriver implements driver over libcuda.so.1 through purego.SyscallN.
// Every Go pointer handed to C is converted in the call expression (so
// SyscallN's go:uintptrescapes keeps it alive and in place) and kept alive
// with runtime.KeepAlive after the call.
type libDriver struct {
	sym *symbols
}

var (
	libOnce sync.Once
	libDrv  *libDriver
	libErr  error
)

// openLibrary loads libcuda once per process (it is never unloaded:
// unloading the driver under live contexts is unsafe).
func openLibrary(path string) (*libDriver, error) {
	if path != defaultLibrary {
		return openLibraryAt(path)
	}
	libOnce.Do(func() { libDrv, libErr = openLibraryAt(path) })
	return libDrv, libErr
}

func openLibraryAt(path string) (*libDriver, error) {
	handle, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cannot load %s: %v", path, err)
	}
	sym, err := loadSymbols(func(name string) (uintptr, error) { return purego.Dlsym(handle, name) })
	if err != nil {
		return nil, err
	}
	return &libDriver{sym: sym}, nil
}

func res(r1 uintptr) cuResult { return cuResult(int32(uint32(r1))) }

// argBuf carries the arguments of the hot-path calls (launch, event
// record and query, copies, graph launch). purego.SyscallN heap-allocates
// a variadic argument list on every call; passing a pooled array's slice
// with ... allocates nothing. Only Go pointers that are pinned (the
// parameter block, pinned host slices) are stored in it, as uintptr,
// and each is kept alive past the call.
type argBuf [11]uintptr

var argPool = sync.Pool{New: func() any { return new(argBuf) }}

func (l *libDriver) Init() cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuInit, 0)
	return res(r)
}

func (l *libDriver) DriverGetVersion() (int32, cuResult) {
	var v int32
	r, _, _ := purego.SyscallN(l.sym.cuDriverGetVersion, uintptr(unsafe.Pointer(&v)))
	runtime.KeepAlive(&v)
	return v, res(r)
}

func (l *libDriver) DeviceGetCount() (int32, cuResult) {
	var n int32
	r, _, _ := purego.SyscallN(l.sym.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))
	runtime.KeepAlive(&n)
	return n, res(r)
}

func (l *libDriver) DeviceGet(ordinal int32) (cuDevice, cuResult) {
	var d cuDevice
	r, _, _ := purego.SyscallN(l.sym.cuDeviceGet, uintptr(unsafe.Pointer(&d)), uintptr(ordinal))
	runtime.KeepAlive(&d)
	return d, res(r)
}

func (l *libDriver) DeviceGetName(dev cuDevice) (string, cuResult) {
	buf := make([]byte, 256)
	r, _, _ := purego.SyscallN(l.sym.cuDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev))
	runtime.KeepAlive(buf)
	if i := strings.IndexByte(string(buf), 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf), res(r)
}

func (l *libDriver) DevicePrimaryCtxRetain(dev cuDevice) (cuContext, cuResult) {
	var c cuContext
	r, _, _ := purego.SyscallN(l.sym.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&c)), uintptr(dev))
	runtime.KeepAlive(&c)
	return c, res(r)
}

func (l *libDriver) DevicePrimaryCtxRelease(dev cuDevice) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuDevicePrimaryCtxRelease, uintptr(dev))
	return res(r)
}

func (l *libDriver) DevicePrimaryCtxReset(dev cuDevice) cuResult {
	if l.sym.cuDevicePrimaryCtxReset == 0 {
		return cudaErrorNotSupported
	}
	r, _, _ := purego.SyscallN(l.sym.cuDevicePrimaryCtxReset, uintptr(dev))
	return res(r)
}

func (l *libDriver) CtxSetCurrent(ctx cuContext) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuCtxSetCurrent, uintptr(ctx))
	return res(r)
}

func (l *libDriver) MemAlloc(size uintptr) (cuDevicePtr, cuResult) {
	var p cuDevicePtr
	r, _, _ := purego.SyscallN(l.sym.cuMemAlloc, uintptr(unsafe.Pointer(&p)), size)
	runtime.KeepAlive(&p)
	return p, res(r)
}

func (l *libDriver) MemFree(p cuDevicePtr) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuMemFree, uintptr(p))
	return res(r)
}

func (l *libDriver) MemsetD8(p cuDevicePtr, v uint8, n uintptr) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuMemsetD8, uintptr(p), uintptr(v), n)
	return res(r)
}

func (l *libDriver) MemHostAlloc(size uintptr, flags uint32) (unsafe.Pointer, cuResult) {
	// The out-parameter is an unsafe.Pointer variable: C stores its own
	// pointer there, so no uintptr→pointer conversion is needed.
	var p unsafe.Pointer
	r, _, _ := purego.SyscallN(l.sym.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), size, uintptr(flags))
	runtime.KeepAlive(&p)
	return p, res(r)
}

func (l *libDriver) MemHostGetDevicePointer(host unsafe.Pointer) (cuDevicePtr, cuResult) {
	var p cuDevicePtr
	r, _, _ := purego.SyscallN(l.sym.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&p)), uintptr(host), 0)
	runtime.KeepAlive(&p)
	return p, res(r)
}

func (l *libDriver) MemFreeHost(host unsafe.Pointer) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuMemFreeHost, uintptr(host))
	return res(r)
}

func (l *libDriver) MemcpyHtoDAsync(dst cuDevicePtr, src unsafe.Pointer, n uintptr, s cuStream) cuResult {
	a := argPool.Get().(*argBuf)
	a[0], a[1], a[2], a[3] = uintptr(dst), uintptr(src), n, uintptr(s) // src: pinned by the stream
	r, _, _ := purego.SyscallN(l.sym.cuMemcpyHtoDAsync, a[:4]...)
	runtime.KeepAlive(src)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) MemcpyDtoHAsync(dst unsafe.Pointer, src cuDevicePtr, n uintptr, s cuStream) cuResult {
	a := argPool.Get().(*argBuf)
	a[0], a[1], a[2], a[3] = uintptr(dst), uintptr(src), n, uintptr(s) // dst: pinned by the stream
	r, _, _ := purego.SyscallN(l.sym.cuMemcpyDtoHAsync, a[:4]...)
	runtime.KeepAlive(dst)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) StreamCreate(flags uint32) (cuStream, cuResult) {
	var s cuStream
	r, _, _ := purego.SyscallN(l.sym.cuStreamCreate, uintptr(unsafe.Pointer(&s)), uintptr(flags))
	runtime.KeepAlive(&s)
	return s, res(r)
}

func (l *libDriver) StreamDestroy(s cuStream) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuStreamDestroy, uintptr(s))
	return res(r)
}

func (l *libDriver) StreamQuery(s cuStream) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuStreamQuery, uintptr(s))
	return res(r)
}

func (l *libDriver) StreamSynchronize(s cuStream) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuStreamSynchronize, uintptr(s))
	return res(r)
}

func (l *libDriver) EventCreate(flags uint32) (cuEvent, cuResult) {
	var e cuEvent
	r, _, _ := purego.SyscallN(l.sym.cuEventCreate, uintptr(unsafe.Pointer(&e)), uintptr(flags))
	runtime.KeepAlive(&e)
	return e, res(r)
}

func (l *libDriver) EventRecord(e cuEvent, s cuStream) cuResult {
	a := argPool.Get().(*argBuf)
	a[0], a[1] = uintptr(e), uintptr(s)
	r, _, _ := purego.SyscallN(l.sym.cuEventRecord, a[:2]...)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) EventQuery(e cuEvent) cuResult {
	a := argPool.Get().(*argBuf)
	a[0] = uintptr(e)
	r, _, _ := purego.SyscallN(l.sym.cuEventQuery, a[:1]...)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) EventDestroy(e cuEvent) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuEventDestroy, uintptr(e))
	return res(r)
}

func (l *libDriver) ModuleLoadData(image []byte) (cuModule, string, cuResult) {
	if len(image) == 0 || image[len(image)-1] != 0 {
		return 0, "image is not NUL-terminated", cudaErrorInvalidValue
	}
	var m cuModule
	logBuf := make([]byte, 8192)
	opts := [2]int32{cuJITErrorLogBuffer, cuJITErrorLogBufferSize}
	// optionValues is void**: the buffer's address, then its size cast to a
	// pointer-sized value. The buffer's address is stored as uintptr in
	// pinned memory, so C receives no unpinned Go pointers.
	var pin runtime.Pinner
	pin.Pin(&logBuf[0])
	vals := [2]uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
	r, _, _ := purego.SyscallN(l.sym.cuModuleLoadDataEx,
		uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0])), 2,
		uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	runtime.KeepAlive(&m)
	runtime.KeepAlive(image)
	runtime.KeepAlive(&opts)
	runtime.KeepAlive(&vals)
	runtime.KeepAlive(logBuf)
	pin.Unpin()
	log := string(logBuf)
	if i := strings.IndexByte(log, 0); i >= 0 {
		log = log[:i]
	}
	return m, strings.TrimSpace(log), res(r)
}

func (l *libDriver) FuncGetParamInfo(f cuFunction, index int) (offset, size uintptr, r cuResult) {
	if l.sym.cuFuncGetParamInfo == 0 {
		return 0, 0, cudaErrorNotSupported
	}
	rr, _, _ := purego.SyscallN(l.sym.cuFuncGetParamInfo, uintptr(f), uintptr(index), uintptr(unsafe.Pointer(&offset)), uintptr(unsafe.Pointer(&size)))
	runtime.KeepAlive(&offset)
	runtime.KeepAlive(&size)
	return offset, size, res(rr)
}

func (l *libDriver) DeviceGetAttribute(attr int32, dev cuDevice) (int32, cuResult) {
	if l.sym.cuDeviceGetAttribute == 0 {
		return 0, cudaErrorNotSupported
	}
	var v int32
	r, _, _ := purego.SyscallN(l.sym.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	runtime.KeepAlive(&v)
	return v, res(r)
}

func (l *libDriver) FuncGetAttribute(attr int32, f cuFunction) (int32, cuResult) {
	if l.sym.cuFuncGetAttribute == 0 {
		return 0, cudaErrorNotSupported
	}
	var v int32
	r, _, _ := purego.SyscallN(l.sym.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(f))
	runtime.KeepAlive(&v)
	return v, res(r)
}

func (l *libDriver) ModuleUnload(m cuModule) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuModuleUnload, uintptr(m))
	return res(r)
}

func (l *libDriver) ModuleGetFunction(m cuModule, name string) (cuFunction, cuResult) {
	var f cuFunction
	cname := append([]byte(name), 0)
	r, _, _ := purego.SyscallN(l.sym.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0])))
	runtime.KeepAlive(&f)
	runtime.KeepAlive(cname)
	return f, res(r)
}

func (l *libDriver) LaunchKernel(f cuFunction, grid, block [3]uint32, sharedMem uint32, s cuStream, p *paramBlock, n int) cuResult {
	var params uintptr
	if n > 0 {
		// p is pinned by its owner for its whole life (see paramBlock).
		params = uintptr(unsafe.Pointer(&p.ptrs[0]))
	}
	a := argPool.Get().(*argBuf)
	*a = argBuf{uintptr(f),
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(sharedMem), uintptr(s), params, 0}
	r, _, _ := purego.SyscallN(l.sym.cuLaunchKernel, a[:]...)
	runtime.KeepAlive(p)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) HasGraphs() bool { return l.sym.graphsLoaded }

func (l *libDriver) StreamBeginCapture(s cuStream, mode uint32) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuStreamBeginCapture, uintptr(s), uintptr(mode))
	return res(r)
}

func (l *libDriver) StreamEndCapture(s cuStream) (cuGraph, cuResult) {
	var g cuGraph
	r, _, _ := purego.SyscallN(l.sym.cuStreamEndCapture, uintptr(s), uintptr(unsafe.Pointer(&g)))
	runtime.KeepAlive(&g)
	return g, res(r)
}

func (l *libDriver) GraphInstantiate(g cuGraph) (cuGraphExec, cuResult) {
	var e cuGraphExec
	r, _, _ := purego.SyscallN(l.sym.cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&e)), uintptr(g), 0)
	runtime.KeepAlive(&e)
	return e, res(r)
}

func (l *libDriver) GraphLaunch(g cuGraphExec, s cuStream) cuResult {
	a := argPool.Get().(*argBuf)
	a[0], a[1] = uintptr(g), uintptr(s)
	r, _, _ := purego.SyscallN(l.sym.cuGraphLaunch, a[:2]...)
	argPool.Put(a)
	return res(r)
}

func (l *libDriver) GraphExecDestroy(g cuGraphExec) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuGraphExecDestroy, uintptr(g))
	return res(r)
}

func (l *libDriver) GraphDestroy(g cuGraph) cuResult {
	r, _, _ := purego.SyscallN(l.sym.cuGraphDestroy, uintptr(g))
	return res(r)
}

func (l *libDriver) ErrorName(code cuResult) string {
	var p *byte
	r, _, _ := purego.SyscallN(l.sym.cuGetErrorName, uintptr(code), uintptr(unsafe.Pointer(&p)))
	runtime.KeepAlive(&p)
	if res(r) != cudaSuccess || p == nil {
		return ""
	}
	return cString(p)
}

// cString copies a NUL-terminated C string (at most 256 bytes).
func cString(p *byte) string {
	var b []byte
	for i := 0; i < 256; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
