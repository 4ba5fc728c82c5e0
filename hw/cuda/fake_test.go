package cuda

import (
	"encoding/binary"
	"math"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stagehost/stagehost/internal/testutil"
)

// fakeDriver is an in-process stand-in for libcuda: devices with one
// context each, memory as Go byte slices addressed by fake device
// pointers, streams that run their work in order on their own goroutine,
// events, sticky errors, graphs, and the kernels in Go. It checks the
// threading discipline: a call that needs a context fails with
// CUDA_ERROR_INVALID_CONTEXT (and is counted) unless the calling OS thread
// made that context current.
type fakeDriver struct {
	ndev   int
	graphs bool

	mu          sync.Mutex
	current     map[int]cuContext // OS thread → current context
	ctxRefs     map[cuContext]int
	sticky      map[cuContext]cuResult
	nextRegion  uint64
	regions     map[uint64][]byte // device address >> 32 → memory
	regionCtx   map[uint64]cuContext
	hostRegions map[unsafe.Pointer]uint64
	nextHandle  uintptr
	streams     map[cuStream]*fakeStream
	events      map[cuEvent]*fakeEvent
	funcs       map[cuFunction]string
	modules     map[cuModule]string
	graphsMade  map[cuGraph][]fakeLaunch
	execs       map[cuGraphExec][]fakeLaunch
	launchFail  cuResult // next launch fails synchronously with this
	noParamInfo bool     // cuFuncGetParamInfo is absent (vendor_fake_test.go)
	funcMods    map[cuFunction]cuModule
	kernelsRun  map[string]int

	// cuFuncGetAttribute (vendor_fake_test.go): absent, failing with
	// funcAttrFail, or answering funcAttrs[attr] over what it reads from
	// the PTX.
	noFuncAttr   bool
	funcAttrFail cuResult
	funcAttrs    map[int32]int32
	unloads      atomic.Int64 // ModuleUnload calls

	wrongThread atomic.Int64
	htod        atomic.Int64  // MemcpyHtoDAsync calls
	htodPinned  atomic.Int64  // of which from pinned memory
	dtohSync    atomic.Int64  // MemcpyDtoHAsync calls into pageable memory (synchronous)
	records     atomic.Int64  // EventRecord calls
	queries     atomic.Int64  // EventQuery calls
	syncs       atomic.Int64  // StreamSynchronize calls
	launching   atomic.Int64  // LaunchKernel calls entered, counted before the launch gate
	gate        sync.RWMutex  // Lock() holds every stream's execution
	launchGate  sync.Mutex    // Lock() holds LaunchKernel callers (see parkDriverThread)
	createGate  chan struct{} // non-nil: StreamCreate waits until it is closed (set before the call)
	destroyed   chan struct{} // non-nil: StreamDestroy sends on it (set before the call)
}

type fakeStream struct {
	ctx     cuContext
	q       chan func()
	capture *[]fakeLaunch
}

type fakeEvent struct {
	ctx  cuContext
	done atomic.Bool
}

type fakeLaunch struct {
	name   string
	params []uint64
}

func newFake(ndev int) *fakeDriver {
	return &fakeDriver{
		ndev: ndev, graphs: true,
		current: map[int]cuContext{}, ctxRefs: map[cuContext]int{}, sticky: map[cuContext]cuResult{},
		nextRegion: 1, regions: map[uint64][]byte{}, regionCtx: map[uint64]cuContext{},
		hostRegions: map[unsafe.Pointer]uint64{}, nextHandle: 0x1000,
		streams: map[cuStream]*fakeStream{}, events: map[cuEvent]*fakeEvent{}, funcs: map[cuFunction]string{}, modules: map[cuModule]string{},
		graphsMade: map[cuGraph][]fakeLaunch{}, execs: map[cuGraphExec][]fakeLaunch{}, kernelsRun: map[string]int{},
	}
}

func ctxOf(dev cuDevice) cuContext { return cuContext(0x100 + int(dev)) }

func (f *fakeDriver) handle() uintptr { f.nextHandle += 16; return f.nextHandle }

// need checks (under f.mu) that this thread has ctx current and that ctx
// is not poisoned.
func (f *fakeDriver) need(ctx cuContext) cuResult {
	if ctx == 0 || f.current[gettid()] != ctx {
		f.wrongThread.Add(1)
		return cudaErrorInvalidContext
	}
	if r := f.sticky[ctx]; r != cudaSuccess {
		return r
	}
	return cudaSuccess
}

func (f *fakeDriver) cur() cuContext { return f.current[gettid()] }

func (f *fakeDriver) Init() cuResult                      { return cudaSuccess }
func (f *fakeDriver) DriverGetVersion() (int32, cuResult) { return 13000, cudaSuccess }
func (f *fakeDriver) DeviceGetCount() (int32, cuResult) {
	if f.ndev == 0 {
		return 0, cudaErrorNoDevice
	}
	return int32(f.ndev), cudaSuccess
}
func (f *fakeDriver) DeviceGet(o int32) (cuDevice, cuResult) {
	if int(o) >= f.ndev {
		return 0, cudaErrorInvalidDevice
	}
	return cuDevice(o), cudaSuccess
}
func (f *fakeDriver) DeviceGetName(cuDevice) (string, cuResult) { return "Fake GPU", cudaSuccess }

func (f *fakeDriver) DevicePrimaryCtxRetain(dev cuDevice) (cuContext, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := ctxOf(dev)
	f.ctxRefs[c]++
	return c, cudaSuccess
}

func (f *fakeDriver) DevicePrimaryCtxRelease(dev cuDevice) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := ctxOf(dev)
	f.ctxRefs[c]--
	if f.ctxRefs[c] == 0 {
		delete(f.sticky, c) // the context is destroyed; a new one is healthy
	}
	return cudaSuccess
}

func (f *fakeDriver) DevicePrimaryCtxReset(dev cuDevice) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sticky, ctxOf(dev))
	return cudaSuccess
}

func (f *fakeDriver) CtxSetCurrent(ctx cuContext) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.current[gettid()] = ctx
	return cudaSuccess
}

func (f *fakeDriver) newRegion(mem []byte, ctx cuContext) cuDevicePtr {
	key := f.nextRegion
	f.nextRegion++
	f.regions[key] = mem
	f.regionCtx[key] = ctx
	return cuDevicePtr(key << 32)
}

// bytes returns n bytes of fake device memory at addr (nil if invalid).
func (f *fakeDriver) bytes(addr, n uint64) []byte {
	f.mu.Lock()
	mem := f.regions[addr>>32]
	f.mu.Unlock()
	off := addr & 0xffffffff
	if mem == nil || off+n > uint64(len(mem)) {
		return nil
	}
	return mem[off : off+n]
}

func (f *fakeDriver) MemAlloc(size uintptr) (cuDevicePtr, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return 0, r
	}
	if size > 1<<30 {
		return 0, cudaErrorOutOfMemory
	}
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = 0xee // like reused device memory: callers must clear it
	}
	return f.newRegion(mem, f.cur()), cudaSuccess
}

func (f *fakeDriver) MemFree(p cuDevicePtr) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return r
	}
	if f.regions[uint64(p)>>32] == nil {
		return cudaErrorInvalidValue
	}
	delete(f.regions, uint64(p)>>32)
	return cudaSuccess
}

func (f *fakeDriver) MemHostAlloc(size uintptr, flags uint32) (unsafe.Pointer, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return nil, r
	}
	if flags != cuMemHostAllocPortable|cuMemHostAllocDeviceMap {
		return nil, cudaErrorInvalidValue
	}
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = 0xee // pinned memory is not zeroed; callers must clear it
	}
	p := unsafe.Pointer(&mem[0])
	f.hostRegions[p] = uint64(f.newRegion(mem, 0))
	return p, cudaSuccess
}

func (f *fakeDriver) MemHostGetDevicePointer(host unsafe.Pointer) (cuDevicePtr, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return 0, r
	}
	a, ok := f.hostRegions[host]
	if !ok {
		return 0, cudaErrorInvalidValue
	}
	return cuDevicePtr(a), cudaSuccess
}

func (f *fakeDriver) MemFreeHost(host unsafe.Pointer) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return r
	}
	a, ok := f.hostRegions[host]
	if !ok {
		return cudaErrorInvalidValue
	}
	delete(f.hostRegions, host)
	delete(f.regions, a>>32)
	return cudaSuccess
}

// streamFor checks the context discipline for a call on s.
func (f *fakeDriver) streamFor(s cuStream) (*fakeStream, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.streams[s]
	if st == nil {
		return nil, cudaErrorInvalidHandle
	}
	if r := f.need(st.ctx); r != cudaSuccess {
		return nil, r
	}
	return st, cudaSuccess
}

func (f *fakeDriver) MemcpyHtoDAsync(dst cuDevicePtr, src unsafe.Pointer, n uintptr, s cuStream) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	f.htod.Add(1)
	// As in CUDA: from pageable memory, src is staged before the call
	// returns; from pinned memory, the copy reads it when it runs.
	staged := unsafe.Slice((*byte)(src), n)
	if !f.pinnedHost(src, n) {
		staged = append([]byte(nil), staged...)
	} else {
		f.htodPinned.Add(1)
	}
	st.q <- func() {
		if mem := f.bytes(uint64(dst), uint64(n)); mem != nil {
			copy(mem, staged)
		} else {
			f.poison(st.ctx, cudaErrorIllegalAddress)
		}
	}
	return cudaSuccess
}

// pinnedHost reports whether [p, p+n) overlaps memory from MemHostAlloc.
func (f *fakeDriver) pinnedHost(p unsafe.Pointer, n uintptr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	lo, hi := uintptr(p), uintptr(p)+n
	for h, a := range f.hostRegions {
		size := uintptr(len(f.regions[a>>32]))
		if uintptr(h) < hi && lo < uintptr(h)+size {
			return true
		}
	}
	return false
}

func (f *fakeDriver) MemcpyDtoHAsync(dst unsafe.Pointer, src cuDevicePtr, n uintptr, s cuStream) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	host := unsafe.Slice((*byte)(dst), n)
	// As in CUDA: into pinned memory the copy is asynchronous; into
	// pageable memory the call returns only once the copy has completed
	// (and with the context's sticky error if the stream failed first).
	pinned := f.pinnedHost(dst, n)
	var done chan struct{}
	if !pinned {
		done = make(chan struct{})
	}
	st.q <- func() {
		if mem := f.bytes(uint64(src), uint64(n)); mem != nil {
			copy(host, mem)
		} else {
			f.poison(st.ctx, cudaErrorIllegalAddress)
		}
		if done != nil {
			close(done)
		}
	}
	if pinned {
		return cudaSuccess
	}
	f.dtohSync.Add(1)
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
		case <-tick.C:
			// The stream's worker skips work once the context is
			// poisoned, so the copy may never run.
			f.mu.Lock()
			r := f.sticky[st.ctx]
			f.mu.Unlock()
			if r == cudaSuccess {
				continue
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sticky[st.ctx]
	}
}

func (f *fakeDriver) poison(ctx cuContext, r cuResult) {
	f.mu.Lock()
	if f.sticky[ctx] == cudaSuccess {
		f.sticky[ctx] = r
	}
	f.mu.Unlock()
}

func (f *fakeDriver) StreamCreate(flags uint32) (cuStream, cuResult) {
	if g := f.createGate; g != nil {
		<-g // a hung cuStreamCreate (docs/gpu.md: with resident kernels parked)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx := f.cur()
	if r := f.need(ctx); r != cudaSuccess {
		return 0, r
	}
	st := &fakeStream{ctx: ctx, q: make(chan func(), 1<<16)}
	h := cuStream(f.handle())
	f.streams[h] = st
	go func() {
		for fn := range st.q {
			f.gate.RLock()
			f.mu.Lock()
			dead := f.sticky[st.ctx] != cudaSuccess
			f.mu.Unlock()
			if !dead {
				fn()
			}
			f.gate.RUnlock()
		}
	}()
	return h, cudaSuccess
}

func (f *fakeDriver) StreamDestroy(s cuStream) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	f.mu.Lock()
	delete(f.streams, s)
	f.mu.Unlock()
	close(st.q)
	if f.destroyed != nil {
		f.destroyed <- struct{}{}
	}
	return cudaSuccess
}

func (f *fakeDriver) StreamQuery(s cuStream) cuResult { return cudaErrorNotSupported }

func (f *fakeDriver) StreamSynchronize(s cuStream) cuResult {
	f.syncs.Add(1)
	if s == 0 {
		// The legacy NULL stream: the fake's memsets are synchronous.
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.need(f.cur())
	}
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	done := make(chan struct{})
	st.q <- func() { close(done) }
	<-done
	return cudaSuccess
}

func (f *fakeDriver) EventCreate(flags uint32) (cuEvent, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx := f.cur()
	if r := f.need(ctx); r != cudaSuccess {
		return 0, r
	}
	h := cuEvent(f.handle())
	f.events[h] = &fakeEvent{ctx: ctx}
	return h, cudaSuccess
}

func (f *fakeDriver) EventRecord(e cuEvent, s cuStream) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	f.mu.Lock()
	ev := f.events[e]
	f.mu.Unlock()
	if ev == nil {
		return cudaErrorInvalidHandle
	}
	f.records.Add(1)
	ev.done.Store(false)
	st.q <- func() { ev.done.Store(true) }
	return cudaSuccess
}

func (f *fakeDriver) EventQuery(e cuEvent) cuResult {
	f.queries.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events[e]
	if ev == nil {
		return cudaErrorInvalidHandle
	}
	if r := f.need(ev.ctx); r != cudaSuccess {
		return r
	}
	if !ev.done.Load() {
		return cudaErrorNotReady
	}
	return cudaSuccess
}

func (f *fakeDriver) EventDestroy(e cuEvent) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.events, e)
	return cudaSuccess
}

var ptxEntry = regexp.MustCompile(`\.entry\s+(\w+)\s*\(`)

func (f *fakeDriver) ModuleLoadData(image []byte) (cuModule, string, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.need(f.cur()); r != cudaSuccess {
		return 0, "", r
	}
	if len(image) == 0 || image[len(image)-1] != 0 || !strings.Contains(string(image), ".target") {
		return 0, "fake: not a PTX image", cudaErrorInvalidPTX
	}
	if log, bad := fakePTXErrors(string(image)); bad {
		return 0, log, cudaErrorInvalidPTX
	}
	m := cuModule(f.handle())
	f.modules[m] = string(image)
	return m, "", cudaSuccess
}

func (f *fakeDriver) ModuleUnload(cuModule) cuResult { f.unloads.Add(1); return cudaSuccess }

func (f *fakeDriver) ModuleGetFunction(m cuModule, name string) (cuFunction, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	found := false
	for _, e := range ptxEntry.FindAllStringSubmatch(f.modules[m], -1) {
		found = found || e[1] == name
	}
	if !found {
		return 0, cudaErrorNotFound
	}
	h := cuFunction(f.handle())
	f.funcs[h] = name
	if f.funcMods == nil {
		f.funcMods = map[cuFunction]cuModule{}
	}
	f.funcMods[h] = m
	return h, cudaSuccess
}

func (f *fakeDriver) LaunchKernel(fn cuFunction, grid, block [3]uint32, shm uint32, s cuStream, p *paramBlock, n int) cuResult {
	// Wait while a test holds the gate to park the driver thread here;
	// launching tells the test the thread got here.
	f.launching.Add(1)
	f.launchGate.Lock()
	//lint:ignore SA2001 the empty critical section is the wait
	f.launchGate.Unlock()
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	f.mu.Lock()
	name := f.funcs[fn]
	fail := f.launchFail
	f.launchFail = cudaSuccess
	f.mu.Unlock()
	if name == "" {
		return cudaErrorInvalidHandle
	}
	if fail != cudaSuccess {
		return fail
	}
	if grid[0] == 0 || block[0] == 0 || block[0] > 1024 {
		return cudaErrorInvalidValue
	}
	params := make([]uint64, n)
	for i := range n {
		// The kernelParams array must point at the values.
		if p.ptrs[i] != unsafe.Pointer(&p.vals[i]) {
			return cudaErrorInvalidValue
		}
		params[i] = p.vals[i]
	}
	l := fakeLaunch{name, params}
	if st.capture != nil {
		*st.capture = append(*st.capture, l)
		return cudaSuccess
	}
	st.q <- func() { f.run(st.ctx, l) }
	return cudaSuccess
}

func (f *fakeDriver) HasGraphs() bool { return f.graphs }

func (f *fakeDriver) StreamBeginCapture(s cuStream, mode uint32) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	st.capture = new([]fakeLaunch)
	return cudaSuccess
}

func (f *fakeDriver) StreamEndCapture(s cuStream) (cuGraph, cuResult) {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return 0, r
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	g := cuGraph(f.handle())
	f.graphsMade[g] = *st.capture
	st.capture = nil
	return g, cudaSuccess
}

func (f *fakeDriver) GraphInstantiate(g cuGraph) (cuGraphExec, cuResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := cuGraphExec(f.handle())
	f.execs[e] = f.graphsMade[g]
	return e, cudaSuccess
}

func (f *fakeDriver) GraphLaunch(g cuGraphExec, s cuStream) cuResult {
	st, r := f.streamFor(s)
	if r != cudaSuccess {
		return r
	}
	f.mu.Lock()
	ls, ok := f.execs[g]
	f.mu.Unlock()
	if !ok {
		return cudaErrorInvalidValue
	}
	for _, l := range ls {
		st.q <- func() { f.run(st.ctx, l) }
	}
	return cudaSuccess
}

func (f *fakeDriver) GraphExecDestroy(g cuGraphExec) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.execs, g)
	return cudaSuccess
}

func (f *fakeDriver) GraphDestroy(g cuGraph) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.graphsMade, g)
	return cudaSuccess
}

func (f *fakeDriver) ErrorName(r cuResult) string { return fallbackNames[r] }

func f32view(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// run executes one kernel in Go on the stream goroutine.
func (f *fakeDriver) run(ctx cuContext, l fakeLaunch) {
	f.mu.Lock()
	f.kernelsRun[l.name]++
	f.mu.Unlock()
	p := l.params
	mem := func(addr, n uint64) []byte {
		b := f.bytes(addr, n)
		if b == nil && n > 0 {
			f.poison(ctx, cudaErrorIllegalAddress)
		}
		return b
	}
	f32 := func(v uint64) float32 { return math.Float32frombits(uint32(v)) }
	switch l.name {
	case "noop":
	case "fault":
		f.poison(ctx, cudaErrorIllegalAddress)
	case "fill":
		for i, x := 0, f32view(mem(p[0], p[2]*4)); i < len(x); i++ {
			x[i] = f32(p[1])
		}
	case "double": // the vendor kernel of testdata/vendor/double.ptx
		x, y := f32view(mem(p[0], uint64(uint32(p[2]))*4)), f32view(mem(p[1], uint64(uint32(p[2]))*4))
		for i := range min(len(x), len(y)) {
			y[i] = 2 * x[i]
		}
	case "copy":
		dst, src := mem(p[0], p[2]), mem(p[1], p[2])
		if dst != nil && src != nil {
			copy(dst, src)
		}
	case "saxpy":
		x, y := f32view(mem(p[1], p[3]*4)), f32view(mem(p[2], p[3]*4))
		for i := range y {
			y[i] = float32(f32(p[0])*x[i]) + y[i] // rounded, then added, as the kernel does
		}
	case "matmul":
		m, n, k := p[3], p[4], p[5]
		a, b, c := f32view(mem(p[0], m*k*4)), f32view(mem(p[1], k*n*4)), f32view(mem(p[2], m*n*4))
		if c != nil {
			copy(c, refMatmul(a, b, int(m), int(n), int(k)))
		}
	case "bias":
		m, n := p[2], p[3]
		x, b := f32view(mem(p[0], m*n*4)), f32view(mem(p[1], n*4))
		if x != nil {
			refBias(x, b, int(m), int(n))
		}
	case "relu":
		refRelu(f32view(mem(p[0], p[1]*4)))
	case "argmax":
		idx, v := refArgmax(f32view(mem(p[0], p[2]*4)))
		if out := mem(p[1], 8); out != nil {
			binary.LittleEndian.PutUint32(out, idx)
			binary.LittleEndian.PutUint32(out[4:], math.Float32bits(v))
		}
	case "mlp_forward":
		in, hid, cls := p[7], p[8], p[9]
		x, w1, b1 := f32view(mem(p[0], in*4)), f32view(mem(p[1], in*hid*4)), f32view(mem(p[2], hid*4))
		w2, b2, sc := f32view(mem(p[3], hid*cls*4)), f32view(mem(p[4], cls*4)), f32view(mem(p[5], cls*4))
		out := mem(p[6], 8)
		if x == nil || w1 == nil || b1 == nil || w2 == nil || b2 == nil || sc == nil || out == nil {
			return
		}
		scores, idx, v := refMLPForward(x, w1, b1, w2, b2)
		copy(sc, scores)
		binary.LittleEndian.PutUint32(out, idx)
		binary.LittleEndian.PutUint32(out[4:], math.Float32bits(v))
	case "resident_gpu_exchange":
		fakeResident(f, ctx, mem(p[0], 4), mem(p[1], residentPayloadBytes), uint32(p[2]))
	case "spin":
		w := mem(p[0]+p[1], 4)
		if w == nil {
			return
		}
		word := (*uint32)(unsafe.Pointer(&w[0]))
		for atomic.LoadUint32(word) != uint32(p[2]) {
			f.mu.Lock()
			dead := f.sticky[ctx] != cudaSuccess
			f.mu.Unlock()
			if dead {
				return
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
}

func (f *fakeDriver) MemsetD8(p cuDevicePtr, v uint8, n uintptr) cuResult {
	f.mu.Lock()
	r := f.need(f.cur())
	f.mu.Unlock()
	if r != cudaSuccess {
		return r
	}
	mem := f.bytes(uint64(p), uint64(n))
	if mem == nil {
		return cudaErrorInvalidValue
	}
	for i := range mem {
		mem[i] = v
	}
	return cudaSuccess
}

// fakeResident is the GPU side of a resident exchange in Go, following
// kernels.cu's resident_gpu_exchange step by step.
func fakeResident(f *fakeDriver, ctx cuContext, line, pay []byte, rounds uint32) {
	if line == nil || pay == nil {
		return
	}
	word := func(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	dead := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sticky[ctx] != cudaSuccess
	}
	await := func(w *uint32, want uint32) bool {
		for atomic.LoadUint32(w) != want {
			if dead() {
				return false
			}
			runtime.Gosched()
		}
		return true
	}
	decision := atomic.LoadUint32(word(line, 0))
	for ; decision == 0; decision = atomic.LoadUint32(word(line, 0)) {
		if dead() {
			return
		}
		runtime.Gosched()
	}
	if decision != 1 {
		return
	}
	atomic.StoreUint32(word(pay, 0), 1)
	x := f32view(pay[128:residentPayloadBytes])
	for r := range rounds {
		if !await(word(pay, 68), r) {
			return
		}
		for i := range x {
			x[i] = float32(x[i]*0.5) + float32(r)
		}
		atomic.StoreUint32(word(pay, 4), r+1)
	}
	await(word(pay, 68), rounds)
}

// parkDriverThread submits a noop launch on r's stream while holding the
// launch gate, and returns once the stream's driver thread is inside
// that launch, parked at the gate: from then on it issues nothing until
// the returned release is called.
func parkDriverThread(t testing.TB, f *fakeDriver, r *rig) (release func()) {
	t.Helper()
	before := f.launching.Load()
	f.launchGate.Lock()
	r.submit("noop", 0)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.launching.Load() > before },
		"the driver thread never reached the parked launch")
	return f.launchGate.Unlock
}
