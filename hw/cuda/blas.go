package cuda

import (
	"log"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw/internal/ops"
)

// The fast tier of gemm (gemm.fast, gemm.f16.fast, gemm.bf16.fast) calls
// cuBLAS, loaded at run time like the driver: libcublas.so.13, then
// libcublas.so.12, by the dynamic loader's search (LD_LIBRARY_PATH
// included), then in the CUDA toolkit's usual directories (see
// blasSearchDirs). Without it, or when a device cannot create a handle,
// the fast programs run the exact kernels; the platform logs that once
// and [Platform.BLAS] reports why.

// blasSymbols is cuBLAS's symbol table, filled like the driver's
// (loadSymbols): every missing required symbol is reported at once.
type blasSymbols struct {
	cublasCreate               uintptr `cublas:"cublasCreate_v2"`
	cublasDestroy              uintptr `cublas:"cublasDestroy_v2"`
	cublasSetStream            uintptr `cublas:"cublasSetStream_v2"`
	cublasSetMathMode          uintptr `cublas:"cublasSetMathMode"`
	cublasSetWorkspace         uintptr `cublas:"cublasSetWorkspace_v2"`
	cublasGemmStridedBatchedEx uintptr `cublas:"cublasGemmStridedBatchedEx"`
	cublasGetVersion           uintptr `cublas:"cublasGetVersion_v2,optional"`
}

// loadBLASSymbols fills a cuBLAS symbol table through lookup, naming every
// missing required symbol in one [errdefs.ErrUnsupported] error.
func loadBLASSymbols(lookup symbolLookup) (*blasSymbols, error) {
	s := new(blasSymbols)
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	var missing []string
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("cublas")
		if !ok {
			continue
		}
		name, optional := strings.CutSuffix(tag, ",optional")
		addr, err := lookup(name)
		if err != nil || addr == 0 {
			if !optional {
				missing = append(missing, name)
			}
			continue
		}
		*(*uintptr)(unsafe.Pointer(v.Field(i).UnsafeAddr())) = addr
	}
	if len(missing) > 0 {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: libcublas lacks %d required symbol(s): %s",
			len(missing), strings.Join(missing, ", "))
	}
	return s, nil
}

// cuBLAS constants (cublas_api.h, library_types.h).
const (
	blasSuccess = 0

	blasOpN = 0 // CUBLAS_OP_N
	blasOpT = 1 // CUBLAS_OP_T

	blasR32F  = 0  // CUDA_R_32F
	blasR16F  = 2  // CUDA_R_16F
	blasR16BF = 14 // CUDA_R_16BF

	blasCompute32F  = 68 // CUBLAS_COMPUTE_32F: float32 compute, no TF32
	blasGemmDefault = -1 // CUBLAS_GEMM_DEFAULT

	// CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION:
	// no TF32, and split-K partial sums stay in float32 for f16 output.
	blasMathMode = 0 | 16
)

// blasHandle is a cublasHandle_t.
type blasHandle uintptr

// gemmCall is one cublasGemmStridedBatchedEx call in cuBLAS's
// column-major terms.
type gemmCall struct {
	transa, transb   int32
	m, n, k          int32
	alpha, beta      float32
	a, b, c          cuDevicePtr
	dtype            int32
	lda, ldb, ldc    int32
	strideA, strideB int64
	strideC          int64
	batch            int32
}

// blasAPI is the seam to cuBLAS, as driver is to libcuda: libBLAS
// implements it with purego; tests use a fake. Every call runs on an OS
// thread with the handle's context current.
type blasAPI interface {
	Create() (blasHandle, int32)
	Destroy(h blasHandle) int32
	SetStream(h blasHandle, s cuStream) int32
	SetMathMode(h blasHandle, mode uint32) int32
	SetWorkspace(h blasHandle, ws cuDevicePtr, size uintptr) int32
	GemmStridedBatched(h blasHandle, g *gemmCall) int32
	Version() int
}

type libBLAS struct {
	sym  *blasSymbols
	path string
}

// blasNames are the sonames tried first, newest first.
var blasNames = []string{"libcublas.so.13", "libcublas.so.12"}

// blasSearchDirs are the directories searched when the loader's own
// search finds no libcublas: CUDA_HOME and CUDA_PATH's lib64 and
// targets/x86_64-linux/lib, /usr/local/cuda's, every /usr/local/cuda-*
// toolkit's, and the distribution's library directories.
func blasSearchDirs() []string {
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if root := os.Getenv(env); root != "" {
			dirs = append(dirs, filepath.Join(root, "lib64"), filepath.Join(root, "targets/x86_64-linux/lib"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	if ms, _ := filepath.Glob("/usr/local/cuda-*/targets/x86_64-linux/lib"); len(ms) > 0 {
		// Newest toolkit first (lexical order is close enough: cuda-13.1 > cuda-12.8).
		for i := len(ms) - 1; i >= 0; i-- {
			dirs = append(dirs, ms[i])
		}
	}
	return append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
}

var (
	blasOnce sync.Once
	blasLib  *libBLAS
	blasErr  error
)

// openBLAS loads cuBLAS once per process (never unloaded). path "" means
// the default search.
func openBLAS(path string) (*libBLAS, error) {
	if path != "" {
		return openBLASAt([]string{path})
	}
	blasOnce.Do(func() {
		cands := append([]string(nil), blasNames...)
		for _, dir := range blasSearchDirs() {
			for _, n := range blasNames {
				cands = append(cands, filepath.Join(dir, n))
			}
		}
		blasLib, blasErr = openBLASAt(cands)
	})
	return blasLib, blasErr
}

func openBLASAt(cands []string) (*libBLAS, error) {
	var reasons []string
	for _, path := range cands {
		if strings.ContainsRune(path, '/') {
			if _, err := os.Stat(path); err != nil {
				continue
			}
		}
		handle, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		sym, err := loadBLASSymbols(func(name string) (uintptr, error) { return purego.Dlsym(handle, name) })
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: %w", path, err)
		}
		return &libBLAS{sym: sym, path: path}, nil
	}
	if len(reasons) == 0 {
		reasons = []string{"not found"}
	}
	return nil, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cannot load cuBLAS (%s): %s",
		strings.Join(blasNames, ", "), strings.Join(reasons, "; "))
}

func blasRes(r uintptr) int32 { return int32(uint32(r)) }

func (l *libBLAS) Create() (blasHandle, int32) {
	var h blasHandle
	r, _, _ := purego.SyscallN(l.sym.cublasCreate, uintptr(unsafe.Pointer(&h)))
	runtime.KeepAlive(&h)
	return h, blasRes(r)
}

func (l *libBLAS) Destroy(h blasHandle) int32 {
	r, _, _ := purego.SyscallN(l.sym.cublasDestroy, uintptr(h))
	return blasRes(r)
}

func (l *libBLAS) SetStream(h blasHandle, s cuStream) int32 {
	r, _, _ := purego.SyscallN(l.sym.cublasSetStream, uintptr(h), uintptr(s))
	return blasRes(r)
}

func (l *libBLAS) SetMathMode(h blasHandle, mode uint32) int32 {
	r, _, _ := purego.SyscallN(l.sym.cublasSetMathMode, uintptr(h), uintptr(mode))
	return blasRes(r)
}

func (l *libBLAS) SetWorkspace(h blasHandle, ws cuDevicePtr, size uintptr) int32 {
	r, _, _ := purego.SyscallN(l.sym.cublasSetWorkspace, uintptr(h), uintptr(ws), size)
	return blasRes(r)
}

func (l *libBLAS) Version() int {
	if l.sym.cublasGetVersion == 0 {
		return 0
	}
	var v int32
	// cublasGetVersion_v2(handle, &version) accepts a NULL handle.
	r, _, _ := purego.SyscallN(l.sym.cublasGetVersion, 0, uintptr(unsafe.Pointer(&v)))
	runtime.KeepAlive(&v)
	if blasRes(r) != blasSuccess {
		return 0
	}
	return int(v)
}

// GemmStridedBatched calls cublasGemmStridedBatchedEx (23 arguments;
// purego passes up to 32). alpha and beta are read by cuBLAS during the
// call (host pointer mode), from g, which the call keeps alive and which
// lives on the driver thread's stack or in its op; their addresses are
// converted in the call expression.
func (l *libBLAS) GemmStridedBatched(h blasHandle, g *gemmCall) int32 {
	r, _, _ := purego.SyscallN(l.sym.cublasGemmStridedBatchedEx,
		uintptr(h), uintptr(g.transa), uintptr(g.transb),
		uintptr(g.m), uintptr(g.n), uintptr(g.k),
		uintptr(unsafe.Pointer(&g.alpha)),
		uintptr(g.a), uintptr(g.dtype), uintptr(g.lda), uintptr(g.strideA),
		uintptr(g.b), uintptr(g.dtype), uintptr(g.ldb), uintptr(g.strideB),
		uintptr(unsafe.Pointer(&g.beta)),
		uintptr(g.c), uintptr(g.dtype), uintptr(g.ldc), uintptr(g.strideC),
		uintptr(g.batch), uintptr(blasCompute32F), uintptr(blasGemmDefault&0xffffffff))
	runtime.KeepAlive(g)
	return blasRes(r)
}

// blasWorkspaceBytes is each stream's cuBLAS workspace (NVIDIA's
// recommendation for Hopper), allocated at the stream's first fast gemm.
const blasWorkspaceBytes = 32 << 20

// deviceBLAS is one device's cuBLAS handle: created on first use of a fast
// program (Prepare), with the device's context current, and used from
// the driver threads of its streams, one call at a time (a handle is not
// safe for concurrent use): each gemm binds the handle to its launch's
// stream and to that stream's own workspace first, so gemms running at
// once on different streams never share scratch memory.
type deviceBLAS struct {
	once sync.Once
	api  blasAPI
	h    blasHandle
	err  error // why the fast tier falls back to the exact kernels
	mu   sync.Mutex
}

// blasLogOnce makes the fallback's log line appear once per process.
var blasLogOnce sync.Once

// fastBLAS returns the device's cuBLAS, or nil when fast programs fall
// back to the exact kernels (and why, logged once per process).
func (d *Device) fastBLAS() *deviceBLAS {
	b := &d.blas
	b.once.Do(func() {
		b.err = d.openBLAS()
		if b.err != nil {
			err := b.err
			blasLogOnce.Do(func() {
				log.Printf("stagehost: %v; the fast tier (gemm*.fast) runs the exact kernels", err)
			})
		}
	})
	if b.err != nil {
		return nil
	}
	return b
}

func (d *Device) openBLAS() error {
	cfg := &d.plat.cfg
	if cfg.noBLAS {
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuBLAS disabled (WithBLASLibrary(\"-\"))")
	}
	api := cfg.blas
	if api == nil && cfg.drv != nil {
		// A fake driver has no context cuBLAS could use.
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: cuBLAS needs the real driver")
	}
	if api == nil {
		lib, err := openBLAS(cfg.blasLibrary)
		if err != nil {
			return err
		}
		api = lib
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return err
	}
	h, r := api.Create()
	if r != blasSuccess {
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: cublasCreate_v2: status %d", d.name, r)
	}
	if r := api.SetMathMode(h, blasMathMode); r != blasSuccess {
		api.Destroy(h)
		return errdefs.Errorf(errdefs.ErrUnsupported, "cuda: %s: cublasSetMathMode: status %d", d.name, r)
	}
	d.blas.api, d.blas.h = api, h
	return nil
}

// closeBLAS destroys the device's handle (Device.Close, context current).
func (d *Device) closeBLAS() {
	b := &d.blas
	if b.api != nil && b.h != 0 && d.Err() == nil {
		b.api.Destroy(b.h)
	}
	b.h = 0
}

// BLAS reports the fast tier's state on the platform's first GPU: the
// cuBLAS version (cublasGetVersion_v2, e.g. 130100; 0 when unknown) and
// nil once a handle was created, or the reason the fast programs run the
// exact kernels. It loads cuBLAS and creates the handle if no fast program
// did yet.
func (p *Platform) BLAS() (version int, err error) {
	if len(p.devices) == 0 {
		return 0, errdefs.Errorf(errdefs.ErrUnsupported, "cuda: no device")
	}
	b := p.devices[0].fastBLAS()
	if b == nil {
		return 0, p.devices[0].blas.err
	}
	return b.api.Version(), nil
}

// gemm issues a fast-tier gemm on stream cs (driver thread). The row-major
// product C = alpha·op(A)·op(B) + beta·C is cuBLAS's column-major
// Cᵀ = alpha·op(B)ᵀ·op(A)ᵀ + beta·Cᵀ: the operands swap, and each
// row-major matrix is its own transpose in column-major order.
func (b *deviceBLAS) gemm(cs cuStream, ws cuDevicePtr, l *launch) int32 {
	p := &l.params
	m, n, k := int32(p[3]), int32(p[4]), int32(p[5])
	ta, tb := p[6] != 0, p[7] != 0
	g := gemmCall{
		m: n, n: m, k: k,
		alpha: f32frombits(p[8]), beta: f32frombits(p[9]),
		a: cuDevicePtr(p[1]), b: cuDevicePtr(p[0]), c: cuDevicePtr(p[2]),
		dtype: int32(l.dtype), ldc: n,
		strideA: int64(p[12]), strideB: int64(p[11]), strideC: int64(p[13]),
		batch: int32(p[10]),
	}
	// cuBLAS's A is our B: row-major K×N (col-major N×K, lda N), or N×K
	// when transB (col-major K×N, transposed, lda K).
	g.transa, g.lda = blasOpN, n
	if tb {
		g.transa, g.lda = blasOpT, k
	}
	g.transb, g.ldb = blasOpN, k
	if ta {
		g.transb, g.ldb = blasOpT, m
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.api.SetStream(b.h, cs); r != blasSuccess {
		return r
	}
	// After SetStream, which resets the workspace to cuBLAS's own pool.
	if r := b.api.SetWorkspace(b.h, ws, blasWorkspaceBytes); r != blasSuccess {
		return r
	}
	return b.api.GemmStridedBatched(b.h, &g)
}

// blasType is cuBLAS's data type for a storage type.
func blasType(t ops.DType) int32 {
	switch t {
	case ops.F16:
		return blasR16F
	case ops.BF16:
		return blasR16BF
	}
	return blasR32F
}

func f32frombits(v uint64) float32 { return math.Float32frombits(uint32(v)) }
