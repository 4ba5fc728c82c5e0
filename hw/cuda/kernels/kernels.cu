// Kernels of the stagehost CUDA backend (package hw/cuda).
//
// Regenerate kernels.ptx from this file with `go generate ./hw/cuda`, which
// runs gen.sh beside this file:
//
//	nvcc -ptx -arch=sm_90 -o kernels.ptx kernels.cu
//
// and lowers the PTX ISA version to 7.8 (see gen.sh). The package embeds
// kernels.ptx and loads it eagerly with cuModuleLoadDataEx.
//
// Conventions, shared with the simulator backend (hw/sim) and with the
// per-kernel table in hw/cuda/kernels.go:
//   - every name is extern "C", so the PTX entry is the plain name;
//   - element loops are grid-stride loops, so any grid is correct and the
//     host may size the grid freely (argmax and mlp_forward need one block
//     of 256);
//   - trailing element counts (n) are added by the host from the buffer
//     ranges; the program's caller never passes them.

typedef unsigned long long u64;
typedef unsigned int u32;

#define GRID_STRIDE(i, n) \
	for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// noop: does nothing (launch-overhead benchmarks).
extern "C" __global__ void noop() {}

// fill(buf, value): buf[i] = value.
extern "C" __global__ void fill(float *buf, float value, u64 n) {
	GRID_STRIDE(i, n) buf[i] = value;
}

// copy(dst, src): copies src's bytes into dst (equal lengths, checked by
// the host). The ranges may overlap: then the host launches a single
// thread, which copies in the safe direction (memmove).
extern "C" __global__ void copy(unsigned char *dst, const unsigned char *src, u64 n) {
	if (gridDim.x == 1 && blockDim.x == 1) {
		if (dst > src) {
			for (u64 i = n; i > 0; i--) dst[i - 1] = src[i - 1];
		} else {
			for (u64 i = 0; i < n; i++) dst[i] = src[i];
		}
		return;
	}
	GRID_STRIDE(i, n) dst[i] = src[i];
}

// saxpy(a, x, y): y = a*x + y (equal lengths, checked by the host); the
// product is rounded before the add, never fused, as on the simulator.
extern "C" __global__ void saxpy(float a, const float *x, float *y, u64 n) {
	GRID_STRIDE(i, n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}

// matmul(A, B, C, M, N, K): C (MxN) = A (MxK) . B (KxN), row-major. Each
// C[i][j] is summed from 0 over k in order, every product rounded before it
// is added (__fmul_rn, __fadd_rn: never contracted into an FMA), so the
// result is bit-identical to the simulator's.
extern "C" __global__ void matmul(const float *A, const float *B, float *C, u32 M, u32 N, u32 K) {
	u64 total = (u64)M * N;
	GRID_STRIDE(idx, total) {
		u64 row = idx / N, col = idx % N;
		const float *a = A + row * K;
		const float *b = B + col;
		float acc = 0.0f;
		for (u64 k = 0; k < K; k++) {
			acc = __fadd_rn(acc, __fmul_rn(a[k], b[k * N]));
		}
		C[idx] = acc;
	}
}

// bias(x, b, M, N): x[i][j] += b[j], x is MxN row-major.
extern "C" __global__ void bias(float *x, const float *b, u32 M, u32 N) {
	u64 total = (u64)M * N;
	GRID_STRIDE(idx, total) x[idx] = x[idx] + b[idx % N];
}

// relu(x): negative values become 0; -0 and NaN stay as they are.
extern "C" __global__ void relu(float *x, u64 n) {
	GRID_STRIDE(i, n) if (x[i] < 0.0f) x[i] = 0.0f;
}

// argmax(x, out): the result of a sequential scan that starts with x[0]
// and moves to every later element strictly greater than the best so far:
// the first largest value, NaNs never larger (a NaN x[0] wins). Writes the
// index (uint32 LE) to out[0:4] and the value's bits (LE) to out[4:8],
// byte by byte (out need not be aligned). x is non-empty (checked by the
// host). One block of 256 threads.
extern "C" __global__ void argmax(const float *x, unsigned char *out, u64 n) {
	__shared__ float sv[256];
	__shared__ u32 si[256];
	u32 t = threadIdx.x;
	float best = -__int_as_float(0x7f800000);
	u32 bi = 0xffffffffu;
	for (u64 i = t; i < n; i += blockDim.x) {
		float v = x[i];
		if (v > best || (v == best && bi == 0xffffffffu)) {
			best = v;
			bi = (u32)i;
		}
	}
	sv[t] = best;
	si[t] = bi;
	for (u32 s = 128; s > 0; s >>= 1) {
		__syncthreads();
		if (t < s) {
			float ov = sv[t + s];
			u32 oi = si[t + s];
			if (ov > best || (ov == best && oi < bi)) {
				best = ov;
				bi = oi;
			}
			sv[t] = best;
			si[t] = bi;
		}
	}
	if (t == 0) {
		float x0 = x[0];
		if (x0 != x0) { // NaN first element: nothing compares greater
			best = x0;
			bi = 0;
		}
		if (bi == 0xffffffffu) bi = 0;
		u32 bits = __float_as_uint(best);
		for (int k = 0; k < 4; k++) {
			out[k] = (unsigned char)(bi >> (8 * k));
			out[4 + k] = (unsigned char)(bits >> (8 * k));
		}
	}
}

// mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C): a two-layer
// perceptron on one input row in one launch of one block of 256 threads.
// x has I values, W1 is IxH, b1 has H values, W2 is HxC, b2 and scores have
// C values (row-major), out at least 8 bytes (any alignment); 1 <= I,
// 1 <= H, C <= MLP_MAX_WIDTH; scores and out overlap neither each other
// nor an input (all checked by the host). It writes
// scores = relu(x.W1 + b1).W2 + b2 and out = argmax(scores) bit for bit as
// matmul, bias, relu, matmul, bias and argmax do: per element the same
// rounded operations in the same order (the sum from 0 over k in order,
// products rounded before adding, then the bias), and argmax's result
// (the first largest score; NaN never larger, a NaN scores[0] wins) from a
// sequential scan. The hidden layer lives in shared memory only.
#define MLP_MAX_WIDTH 1024

extern "C" __global__ void mlp_forward(const float *x, const float *W1, const float *b1, const float *W2,
				       const float *b2, float *scores, unsigned char *out, u32 I, u32 H, u32 C) {
	__shared__ float h[MLP_MAX_WIDTH];
	__shared__ float s[MLP_MAX_WIDTH];
	for (u32 j = threadIdx.x; j < H; j += blockDim.x) {
		float acc = 0.0f;
		for (u32 k = 0; k < I; k++) {
			acc = __fadd_rn(acc, __fmul_rn(x[k], W1[(u64)k * H + j]));
		}
		acc = __fadd_rn(acc, b1[j]);
		if (acc < 0.0f) acc = 0.0f;
		h[j] = acc;
	}
	__syncthreads();
	for (u32 j = threadIdx.x; j < C; j += blockDim.x) {
		float acc = 0.0f;
		for (u32 k = 0; k < H; k++) {
			acc = __fadd_rn(acc, __fmul_rn(h[k], W2[(u64)k * C + j]));
		}
		acc = __fadd_rn(acc, b2[j]);
		s[j] = acc;
		scores[j] = acc;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		float best = s[0];
		u32 bi = 0;
		for (u32 j = 1; j < C; j++) {
			if (s[j] > best) {
				best = s[j];
				bi = j;
			}
		}
		u32 bits = __float_as_uint(best);
		for (int k = 0; k < 4; k++) {
			out[k] = (unsigned char)(bi >> (8 * k));
			out[4 + k] = (unsigned char)(bits >> (8 * k));
		}
	}
}

// fault: stores through an unmapped address on purpose, so that tests can
// provoke CUDA_ERROR_ILLEGAL_ADDRESS (a sticky, context-wide error).
extern "C" __global__ void fault() {
	*(volatile u32 *)(u64)8 = 1;
}

// spin(buf, off, want): one thread polls the uint32 at byte offset off of
// buf (4-byte aligned, checked by the host) with acquire loads at system
// scope until it equals want. It never gives up: a lost device ends it.
extern "C" __global__ void spin(const unsigned char *buf, u64 off, u32 want) {
	const u32 *word = (const u32 *)(buf + off);
	u32 v;
	do {
		asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
	} while (v != want);
}

// resident_gpu_exchange(line, payload, rounds): the GPU participant of a
// resident GPU–NPU exchange (package sessions, NewCUDAExchange), launched
// as one block of one thread. The payload layout is sessions' (checked by
// the host: at least 192 bytes, 4-byte aligned, not overlapping the line):
//
//	payload + 0    GPU observed word (1 once RUN was seen)
//	payload + 4    GPU credit: rounds the GPU has produced
//	payload + 64   NPU observed word   (written by the peer only)
//	payload + 68   NPU credit          (written by the peer only)
//	payload + 128  16 float32 values x
//
// It polls the startup word with acquire loads at system scope and touches
// nothing else before a decision. Any decision but RUN (=1) is ABORT: it
// retires at once without touching the payload. On RUN it release-stores
// its observed word at once (so the host can time publish -> observe),
// then for r in [0, rounds): waits for the NPU credit r, computes
// x = x*0.5 + r (rounded multiply, then rounded add: never fused, so the
// result is bit-identical to sessions.ExpectedPayload) and release-stores
// its credit r+1; it retires after the NPU's last credit. The startup word
// is only read.
__device__ static __forceinline__ u32 ld_acquire_sys(const u32 *p) {
	u32 v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ static __forceinline__ void st_release_sys(u32 *p, u32 v) {
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

extern "C" __global__ void resident_gpu_exchange(const unsigned char *line, unsigned char *payload, u32 rounds) {
	u32 decision;
	do {
		decision = ld_acquire_sys((const u32 *)line);
	} while (decision == 0);
	if (decision != 1) return;
	st_release_sys((u32 *)(payload + 0), 1);
	u32 *credit = (u32 *)(payload + 4);
	const u32 *peer = (const u32 *)(payload + 68);
	volatile float *x = (volatile float *)(payload + 128);
	for (u32 r = 0; r < rounds; r++) {
		while (ld_acquire_sys(peer) != r) {
		}
		float fr = (float)r;
		for (int i = 0; i < 16; i++) x[i] = __fadd_rn(__fmul_rn(x[i], 0.5f), fr);
		st_release_sys(credit, r + 1);
	}
	while (ld_acquire_sys(peer) != rounds) {
	}
}

// ---------------------------------------------------------------------------
// The op library (hw/ops): every op in float32 storage (entry suffix _f32)
// and, where the contract has them, float16 and bfloat16 storage (_f16,
// _bf16): each stored value is converted to float32 exactly, computed in
// float32 and rounded once to the storage type, to nearest even
// (__float2half_rn, __float2bfloat16_rn).
//
// Exact-tier arithmetic is spelled with the correctly rounded intrinsics
// (__fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn), which nvcc
// never contracts into an FMA; the module is built without -ftz, so
// denormals are kept as on the CPU. Bounded ops (exp, log, tanh, sigmoid,
// silu, gelu_*, softmax, log_softmax) use CUDA's float32 functions; their
// error bounds are stated in hw/cuda/ops.go and tested against float64.
//
// Every row or axis reduction uses the contract's one order, which a block
// of exactly 256 threads implements: lane t accumulates its elements t,
// t+256, t+512, ... in ascending order starting from the identity (0 for
// sums), then the lanes combine by the tree
// for s in 128, 64, ..., 1: p[t] = p[t] + p[t+s] (t < s); the result is
// p[0]. The host launches these kernels with blockDim.x == 256.
// ---------------------------------------------------------------------------

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef __half f16;
typedef __nv_bfloat16 bf16;

__device__ static __forceinline__ float ld(const float *p, u64 i) { return p[i]; }
__device__ static __forceinline__ float ld(const f16 *p, u64 i) { return __half2float(p[i]); }
__device__ static __forceinline__ float ld(const bf16 *p, u64 i) { return __bfloat162float(p[i]); }
__device__ static __forceinline__ void st(float *p, u64 i, float v) { p[i] = v; }
__device__ static __forceinline__ void st(f16 *p, u64 i, float v) { p[i] = __float2half_rn(v); }
__device__ static __forceinline__ void st(bf16 *p, u64 i, float v) { p[i] = __float2bfloat16_rn(v); }

#define F32_INF __int_as_float(0x7f800000)
#define F32_NAN __int_as_float(0x7fc00000)

__device__ static __forceinline__ bool isnanf_(float v) { return v != v; }

// max and min of the contract: NaN if either is NaN; max(-0,+0) = +0 and
// min(-0,+0) = -0 (for equal operands the sign bits are combined: equal
// non-zero floats have equal bits).
__device__ static __forceinline__ float op_max(float a, float b) {
	if (isnanf_(a) || isnanf_(b)) return F32_NAN;
	if (a > b) return a;
	if (b > a) return b;
	return __int_as_float(__float_as_int(a) & __float_as_int(b));
}

__device__ static __forceinline__ float op_min(float a, float b) {
	if (isnanf_(a) || isnanf_(b)) return F32_NAN;
	if (a < b) return a;
	if (b < a) return b;
	return __int_as_float(__float_as_int(a) | __float_as_int(b));
}

// sigmoid(x) = 1/(1+e^-x) for x >= 0 and e^x/(1+e^x) below, so that no
// result underflows to 0 early and no cancellation occurs.
__device__ static __forceinline__ float sigmoid_f(float x) {
	if (x >= 0.0f) return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
	float e = expf(x);
	return __fdiv_rn(e, __fadd_rn(1.0f, e));
}

// exp(h + l) for a float32 pair whose sum is the exact argument: the
// low part enters as a first-order correction, so an argument that
// float32 cannot hold loses no accuracy (gelu_tanh, softmax).
__device__ static __forceinline__ float exp2part(float h, float l) {
	float e = expf(h);
	if (!isfinite(e) || e == 0.0f || !isfinite(l)) return e; // no Inf*l = NaN
	return fmaf(e, l, e);
}

// gelu_tanh(x) = 0.5x(1 + tanh(u)), u = sqrt(2/pi)(x + 0.044715x^3),
// computed as x / (1 + e^(-2u)) with -2u in float64 (split into a float32
// pair), so that large |x| neither cancels nor amplifies u's rounding.
__device__ static __forceinline__ float gelu_tanh_f(float x) {
	if (isnanf_(x)) return x;
	if (!isfinite(x)) return x > 0.0f ? x : -0.0f;
	double xd = (double)x;
	double w = -2.0 * 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
	float wh = (float)w;
	float wl = (float)(w - (double)wh);
	if (wh > 88.0f) {
		// e^w overflows float32: x / e^w, split as (x / e^(w/2)) / e^(w/2).
		float hw = (float)(w * 0.5);
		float e = exp2part(hw, (float)(w * 0.5 - (double)hw));
		return __fdiv_rn(__fdiv_rn(x, e), e);
	}
	float e = exp2part(wh, wl);
	return __fdiv_rn(x, __fadd_rn(1.0f, e));
}

// gelu_erf(x) = 0.5x(1 + erf(x/sqrt2)) = 0.5x erfc(-x/sqrt2): erfc keeps
// the negative side free of cancellation; the argument is formed in
// float64 and its float32 rounding error enters erfc as a first-order
// correction (erfc'(z) = -2/sqrt(pi) e^(-z^2)).
__device__ static __forceinline__ float gelu_erf_f(float x) {
	if (isnanf_(x)) return x;
	if (!isfinite(x)) return x > 0.0f ? x : -0.0f;
	double z = -(double)x * 0.7071067811865476;
	float zh = (float)z;
	float zl = (float)(z - (double)zh);
	float c = erfcf(zh);
	c = fmaf(-1.1283791670955126f * expf(-zh * zh), zl, c);
	return __fmul_rn(__fmul_rn(0.5f, x), c);
}

// Unary op codes (the order of the Go table in ops.go).
#define U_EXP 0
#define U_LOG 1
#define U_TANH 2
#define U_SIGMOID 3
#define U_GELU_TANH 4
#define U_GELU_ERF 5
#define U_SILU 6
#define U_RSQRT 7
#define U_SQRT 8
#define U_NEG 9
#define U_ABS 10

__device__ static __forceinline__ float unary_f(u32 op, float x) {
	switch (op) {
	case U_EXP: return expf(x);
	case U_LOG: return logf(x);
	case U_TANH: return tanhf(x);
	case U_SIGMOID: return sigmoid_f(x);
	case U_GELU_TANH: return gelu_tanh_f(x);
	case U_GELU_ERF: return gelu_erf_f(x);
	case U_SILU: return x == -F32_INF ? -0.0f : __fmul_rn(x, sigmoid_f(x)); // not -Inf*0 = NaN
	case U_RSQRT: return __fdiv_rn(1.0f, __fsqrt_rn(x));
	case U_SQRT: return __fsqrt_rn(x);
	case U_NEG: return __int_as_float(__float_as_int(x) ^ 0x80000000);
	case U_ABS: return __int_as_float(__float_as_int(x) & 0x7fffffff);
	}
	return F32_NAN;
}

// unary_T(x, y, n, op): y[i] = op(x[i]); y may be x.
template <typename T> __device__ static void unary_k(const T *x, T *y, u64 n, u32 op) {
	GRID_STRIDE(i, n) st(y, i, unary_f(op, ld(x, i)));
}

// affine_T(x, y, n, a, b): y = a*x + b, the product rounded before the add.
template <typename T> __device__ static void affine_k(const T *x, T *y, u64 n, float a, float b) {
	GRID_STRIDE(i, n) st(y, i, __fadd_rn(__fmul_rn(a, ld(x, i)), b));
}

#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_MAX 4
#define B_MIN 5

__device__ static __forceinline__ float binary_f(u32 op, float a, float b) {
	switch (op) {
	case B_ADD: return __fadd_rn(a, b);
	case B_SUB: return __fsub_rn(a, b);
	case B_MUL: return __fmul_rn(a, b);
	case B_DIV: return __fdiv_rn(a, b);
	case B_MAX: return op_max(a, b);
	case B_MIN: return op_min(a, b);
	}
	return F32_NAN;
}

// binary_T(a, b, c, op, c0..c3, sa0..sa3, sb0..sb3): c has dims c0..c3
// (row-major); a and b are read with per-dim element strides (0 on a
// broadcast dim), computed by the host from their shapes.
template <typename T>
__device__ static void binary_k(const T *a, const T *b, T *c, u32 op, u64 c0, u64 c1, u64 c2, u64 c3, u64 sa0,
				u64 sa1, u64 sa2, u64 sa3, u64 sb0, u64 sb1, u64 sb2, u64 sb3) {
	u64 n = c0 * c1 * c2 * c3;
	if (c0 * c1 * c2 == 1 && sa3 == 1 && sb3 == 1) {
		// No broadcasting (the host passes such shapes as one dim).
		GRID_STRIDE(i, n) st(c, i, binary_f(op, ld(a, i), ld(b, i)));
		return;
	}
	GRID_STRIDE(i, n) {
		u64 r = i;
		u64 i3 = r % c3;
		r /= c3;
		u64 i2 = r % c2;
		r /= c2;
		u64 i1 = r % c1;
		u64 i0 = r / c1;
		float va = ld(a, i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3);
		float vb = ld(b, i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3);
		st(c, i, binary_f(op, va, vb));
	}
}

// tree_sum: the contract's lane tree over one value per thread of a block
// of 256; every thread gets p[0]. p is shared scratch of 256 floats.
// The last five levels (s = 16 ... 1) run in warp 0 with shuffles: lane t
// adds lane t+s's value, the same addition as p[t] + p[t+s] (lanes t >= s
// compute values no later level reads).
__device__ static float tree_sum(float v, float *p) {
	u32 t = threadIdx.x;
	p[t] = v;
	__syncthreads();
	for (u32 s = 128; s >= 32; s >>= 1) {
		if (t < s) p[t] = __fadd_rn(p[t], p[t + s]);
		__syncthreads();
	}
	if (t < 32) {
		float w = p[t];
		for (u32 s = 16; s > 0; s >>= 1) w = __fadd_rn(w, __shfl_down_sync(0xffffffffu, w, s));
		if (t == 0) p[0] = w;
	}
	__syncthreads();
	float r = p[0];
	__syncthreads();
	return r;
}

// tree_max: the same tree with op_max (its result does not depend on the
// order: NaN if any value is NaN, +0 over -0).
__device__ static float tree_max(float v, float *p) {
	u32 t = threadIdx.x;
	p[t] = v;
	__syncthreads();
	for (u32 s = 128; s >= 32; s >>= 1) {
		if (t < s) p[t] = op_max(p[t], p[t + s]);
		__syncthreads();
	}
	if (t < 32) {
		float w = p[t];
		for (u32 s = 16; s > 0; s >>= 1) w = op_max(w, __shfl_down_sync(0xffffffffu, w, s));
		if (t == 0) p[0] = w;
	}
	__syncthreads();
	float r = p[0];
	__syncthreads();
	return r;
}

#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2
#define R_ARGMAX 3

// reduce_T(x, y, outer, n, inner, op): x is [outer, n, inner], y is
// [outer, inner] (int32 indices for argmax). One block of 256 threads per
// output, blocks striding over the outputs. sum and mean use the lane
// order and tree (mean = sum / n, one division); max propagates NaN;
// argmax is the first index of the largest value, NaN never larger (0
// when every value is NaN): order-independent.
template <typename T>
__device__ static void reduce_k(const T *x, void *yv, u64 outer, u64 n, u64 inner, u32 op) {
	__shared__ float p[256];
	__shared__ u64 pi[256];
	u32 t = threadIdx.x;
	for (u64 o = blockIdx.x; o < outer * inner; o += gridDim.x) {
		u64 base = (o / inner) * n * inner + o % inner;
		if (op == R_ARGMAX) {
			float best = 0.0f;
			u64 bi = ~0ull;
			for (u64 j = t; j < n; j += 256) {
				float v = ld(x, base + j * inner);
				if (!isnanf_(v) && (bi == ~0ull || v > best)) {
					best = v;
					bi = j;
				}
			}
			p[t] = best;
			pi[t] = bi;
			__syncthreads();
			for (u32 s = 128; s > 0; s >>= 1) {
				if (t < s) {
					float ov = p[t + s];
					u64 oi = pi[t + s];
					if (oi != ~0ull && (pi[t] == ~0ull || ov > p[t] || (ov == p[t] && oi < pi[t]))) {
						p[t] = ov;
						pi[t] = oi;
					}
				}
				__syncthreads();
			}
			if (t == 0) {
				u64 r = pi[0];
				if (r == ~0ull) r = 0;
				((int *)yv)[o] = (int)r;
			}
			__syncthreads();
			continue;
		}
		float acc = op == R_MAX ? -F32_INF : 0.0f;
		for (u64 j = t; j < n; j += 256) {
			float v = ld(x, base + j * inner);
			acc = op == R_MAX ? op_max(acc, v) : __fadd_rn(acc, v);
		}
		float r = op == R_MAX ? tree_max(acc, p) : tree_sum(acc, p);
		if (op == R_MEAN) r = __fdiv_rn(r, (float)n);
		if (t == 0) st((T *)yv, o, r);
	}
}

// The argument of exp in softmax, x - m, as a float32 pair (TwoSum): the
// high part is the rounded difference, the low part its exact error (0
// when the difference is not finite).
__device__ static __forceinline__ void diff2(float x, float m, float *h, float *l) {
	float s = __fsub_rn(x, m);
	*h = s;
	if (!isfinite(s)) {
		*l = 0.0f;
		return;
	}
	float nm = -m;
	float bb = __fsub_rn(s, x);
	*l = __fadd_rn(__fsub_rn(x, __fsub_rn(s, bb)), __fsub_rn(nm, bb));
}

// Rows of at most 256*ROW_CACHE values are read once into registers
// (lane t holds columns t, t+256, ...), then every pass runs over the
// registers in the same order as the uncached loops: the arithmetic, and
// so every result, is the same.
#define ROW_CACHE 8

template <typename T>
__device__ static void softmax_cached(const T *x, T *y, u64 rows, u64 cols, u64 causal, u32 lg, float *p) {
	u32 t = threadIdx.x;
	for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
		u64 lim = cols;
		if (causal > 0) lim = r % causal + (cols - causal) + 1;
		const u64 base = r * cols;
		float v[ROW_CACHE];
		float m = -F32_INF;
#pragma unroll
		for (int c = 0; c < ROW_CACHE; c++) {
			u64 j = t + 256 * (u64)c;
			v[c] = j < cols ? ld(x, base + j) : 0.0f;
			if (j < lim) m = op_max(m, v[c]);
		}
		m = tree_max(m, p);
		float s = 0.0f;
#pragma unroll
		for (int c = 0; c < ROW_CACHE; c++) {
			u64 j = t + 256 * (u64)c;
			if (j < lim) {
				float h, l;
				diff2(v[c], m, &h, &l);
				s = __fadd_rn(s, exp2part(h, l));
			}
		}
		s = tree_sum(s, p);
		float ls = logf(s);
#pragma unroll
		for (int c = 0; c < ROW_CACHE; c++) {
			u64 j = t + 256 * (u64)c;
			if (j >= cols) continue;
			float o;
			if (j >= lim) {
				o = lg ? -F32_INF : 0.0f;
			} else {
				float h, l;
				diff2(v[c], m, &h, &l);
				o = lg ? __fadd_rn(__fsub_rn(h, ls), l) : __fdiv_rn(exp2part(h, l), s);
			}
			st(y, base + j, o);
		}
	}
}

// rstd(v, eps) = 1/sqrt(v + eps): three correctly rounded operations.
__device__ static __forceinline__ float rstd(float v, float eps) {
	return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, eps)));
}

// Rows of at most WARP_COLS values run one per warp (8 rows per block of
// 256), with no shared memory and no block barrier. Lane l of the warp
// holds columns l + 32i (i < WARP_COLS/32) in registers. Column j is the
// contract's lane t = j mod 256 = l + 32(i mod 8), and lane t's columns
// arrive in ascending order as i ascends, so each thread keeps eight of
// the 256 lane partials (q[k] is lane l + 32k) and adds to them in the
// contract's order. warp_tree_sum then runs the tree: the levels s = 128,
// 64, 32 combine partials within a thread (lane t + s is partial
// k + s/32 of the same thread), the levels 16 ... 1 are tree_sum's
// shuffles. Every addition has the operands, and the order, of the block
// version: the results are the same bits.
#define WARP_COLS 1024
#define WARP_VALS (WARP_COLS / 32)

__device__ static __forceinline__ float warp_tree_sum(float *q) {
#pragma unroll
	for (int k = 0; k < 4; k++) q[k] = __fadd_rn(q[k], q[k + 4]);
#pragma unroll
	for (int k = 0; k < 2; k++) q[k] = __fadd_rn(q[k], q[k + 2]);
	float w = __fadd_rn(q[0], q[1]);
	for (u32 s = 16; s > 0; s >>= 1) w = __fadd_rn(w, __shfl_down_sync(0xffffffffu, w, s));
	return __shfl_sync(0xffffffffu, w, 0);
}

__device__ static __forceinline__ float warp_tree_max(float *q) {
#pragma unroll
	for (int k = 0; k < 4; k++) q[k] = op_max(q[k], q[k + 4]);
#pragma unroll
	for (int k = 0; k < 2; k++) q[k] = op_max(q[k], q[k + 2]);
	float w = op_max(q[0], q[1]);
	for (u32 s = 16; s > 0; s >>= 1) w = op_max(w, __shfl_down_sync(0xffffffffu, w, s));
	return __shfl_sync(0xffffffffu, w, 0);
}

// WARP_ROWS(r) loops r over this warp's rows: warp w of the grid takes
// rows w, w + 8·gridDim.x, ...
#define WARP_ROWS(r, rows)                                                                                 \
	for (u64 r = (u64)blockIdx.x * 8 + (threadIdx.x >> 5); r < (rows); r += (u64)gridDim.x * 8)

// WARP_COUNT(n) is how many of lane ln's columns ln + 32i lie below n
// (i < WARP_COUNT(n) <=> ln + 32i < n), so that the loops below compare
// the constant i with one register instead of keeping a 64-bit column
// index per value.
#define WARP_COUNT(n) ((n) > ln ? (int)(((n) - ln + 31) / 32) : 0)

template <typename T>
__device__ static void softmax_warp(const T *x, T *y, u64 rows, u64 cols, u64 causal, u32 lg) {
	u32 ln = threadIdx.x & 31;
	const int nc = WARP_COUNT(cols);
	WARP_ROWS(r, rows) {
		u64 lim = cols;
		if (causal > 0) lim = r % causal + (cols - causal) + 1;
		const int nl = WARP_COUNT(lim);
		const T *xr = x + r * cols + ln;
		T *yr = y + r * cols + ln;
		float v[WARP_VALS], q[8];
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = -F32_INF;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) v[i] = i < nc ? ld(xr, 32 * i) : 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (i < nl) q[i % 8] = op_max(q[i % 8], v[i]);
		float m = warp_tree_max(q);
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) {
			if (i < nl) {
				float h, l;
				diff2(v[i], m, &h, &l);
				float e = exp2part(h, l);
				q[i % 8] = __fadd_rn(q[i % 8], e);
				if (!lg) v[i] = e; // softmax needs only e^(x-max) from here on
			}
		}
		float s = warp_tree_sum(q);
		float ls = logf(s);
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) {
			if (i >= nc) continue;
			float o;
			if (i >= nl) {
				o = lg ? -F32_INF : 0.0f;
			} else if (lg) {
				float h, l;
				diff2(v[i], m, &h, &l);
				o = __fadd_rn(__fsub_rn(h, ls), l);
			} else {
				o = __fdiv_rn(v[i], s);
			}
			st(yr, 32 * i, o);
		}
	}
}

template <typename T>
__device__ static void layernorm_warp(const T *x, const T *g, const T *bt, T *y, u64 rows, u64 cols, float eps) {
	u32 ln = threadIdx.x & 31;
	const int nc = WARP_COUNT(cols);
	const T *gr = g + ln, *br = bt + ln;
	WARP_ROWS(r, rows) {
		const T *xr = x + r * cols + ln;
		T *yr = y + r * cols + ln;
		float v[WARP_VALS], q[8];
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) v[i] = i < nc ? ld(xr, 32 * i) : 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (i < nc) q[i % 8] = __fadd_rn(q[i % 8], v[i]);
		float mean = __fdiv_rn(warp_tree_sum(q), (float)cols);
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) {
			if (i < nc) {
				float d = __fsub_rn(v[i], mean);
				v[i] = d;
				q[i % 8] = __fadd_rn(q[i % 8], __fmul_rn(d, d));
			}
		}
		float rs = rstd(__fdiv_rn(warp_tree_sum(q), (float)cols), eps);
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (i < nc) st(yr, 32 * i, __fadd_rn(__fmul_rn(__fmul_rn(v[i], rs), ld(gr, 32 * i)), ld(br, 32 * i)));
	}
}

template <typename T>
__device__ static void rmsnorm_warp(const T *x, const T *g, T *y, u64 rows, u64 cols, float eps) {
	u32 ln = threadIdx.x & 31;
	const int nc = WARP_COUNT(cols);
	const T *gr = g + ln;
	WARP_ROWS(r, rows) {
		const T *xr = x + r * cols + ln;
		T *yr = y + r * cols + ln;
		float v[WARP_VALS], q[8];
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) v[i] = i < nc ? ld(xr, 32 * i) : 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (i < nc) q[i % 8] = __fadd_rn(q[i % 8], __fmul_rn(v[i], v[i]));
		float rs = rstd(__fdiv_rn(warp_tree_sum(q), (float)cols), eps);
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (i < nc) st(yr, 32 * i, __fmul_rn(__fmul_rn(v[i], rs), ld(gr, 32 * i)));
	}
}

// SOFTMAX_VEC = 1 (the default, the committed kernels.ptx) reads and
// writes float32 rows whose columns are a multiple of 4 (and whose x and
// y are 16-byte aligned) as float4, in softmax_warp4; 0 keeps every row on
// softmax_warp's scalar loads. The results are the same bits either way
// (TestGPUSoftmaxVectorMatchesScalar). docs/gpu.md, runs 19 and 20: with
// SOFTMAX_MINB=4 besides, softmax and log_softmax measured 0.58-0.75 of
// the copy's bandwidth against 0.55-0.57 for the scalar loads.
#ifndef SOFTMAX_VEC
#define SOFTMAX_VEC 1
#endif

// softmax_warp4 is softmax_warp for float32 rows of a multiple of 4
// columns, read and written as float4: lane l holds columns
// 128i + 4l + c (i < 8, c < 4). Column j is the contract's lane
// t = j mod 256 = 128(i mod 2) + 4l + c, so each thread keeps the 8 lane
// partials (i mod 2, c), each added to in ascending column order as i
// ascends. The tree: level 128 adds partial (1, c) to (0, c) in the
// thread, the levels 64 ... 4 add lane l + 16 ... l + 1's partial c by
// shuffles (4 each), the levels 2 and 1 add partials c + 2 and c + 1 in
// lane 0. Every addition has the operands of the block tree, so the sum,
// and every result, has the same bits as softmax_warp's. The max does not
// depend on the order (op_max): one running max per thread.
__device__ static __forceinline__ float warp4_tree_sum(float *q) {
#pragma unroll
	for (int c = 0; c < 4; c++) q[c] = __fadd_rn(q[c], q[c + 4]);
	for (u32 s = 16; s > 0; s >>= 1) {
#pragma unroll
		for (int c = 0; c < 4; c++) q[c] = __fadd_rn(q[c], __shfl_down_sync(0xffffffffu, q[c], s));
	}
	q[0] = __fadd_rn(q[0], q[2]);
	q[1] = __fadd_rn(q[1], q[3]);
	return __shfl_sync(0xffffffffu, __fadd_rn(q[0], q[1]), 0);
}

__device__ static bool softmax_warp4(const f16 *, f16 *, u64, u64, u64, u32) { return false; }
__device__ static bool softmax_warp4(const bf16 *, bf16 *, u64, u64, u64, u32) { return false; }

__device__ static bool softmax_warp4(const float *x, float *y, u64 rows, u64 cols, u64 causal, u32 lg) {
	if (!SOFTMAX_VEC || cols % 4 != 0 || ((unsigned long long)x | (unsigned long long)y) % 16 != 0) return false;
	u32 ln = threadIdx.x & 31;
	const int c4 = (int)cols;    // cols <= WARP_COLS
	const int j0 = 4 * (int)ln; // column of value (0, 0)
	const int nv = c4 > j0 ? (c4 - j0 + 127) / 128 : 0; // float4s of this lane
	WARP_ROWS(r, rows) {
		int lim = c4;
		if (causal > 0) lim = (int)(r % causal + (cols - causal) + 1);
		const float4 *xr = (const float4 *)(x + r * cols) + ln;
		float4 *yr = (float4 *)(y + r * cols) + ln;
		float v[WARP_VALS], q[8];
#pragma unroll
		for (int i = 0; i < WARP_VALS / 4; i++) {
			float4 a = i < nv ? xr[32 * i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
		}
		float m = -F32_INF;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++)
			if (128 * (i / 4) + j0 + i % 4 < lim) m = op_max(m, v[i]);
		for (u32 s = 16; s > 0; s >>= 1) m = op_max(m, __shfl_xor_sync(0xffffffffu, m, s));
#pragma unroll
		for (int k = 0; k < 8; k++) q[k] = 0.0f;
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) {
			if (128 * (i / 4) + j0 + i % 4 < lim) {
				float h, l;
				diff2(v[i], m, &h, &l);
				float e = exp2part(h, l);
				q[(i / 4) % 2 * 4 + i % 4] = __fadd_rn(q[(i / 4) % 2 * 4 + i % 4], e);
				if (!lg) v[i] = e;
			}
		}
		float s = warp4_tree_sum(q);
		float ls = logf(s);
#pragma unroll
		for (int i = 0; i < WARP_VALS; i++) {
			float o;
			if (128 * (i / 4) + j0 + i % 4 >= lim) {
				o = lg ? -F32_INF : 0.0f;
			} else if (lg) {
				float h, l;
				diff2(v[i], m, &h, &l);
				o = __fadd_rn(__fsub_rn(h, ls), l);
			} else {
				o = __fdiv_rn(v[i], s);
			}
			v[i] = o;
		}
#pragma unroll
		for (int i = 0; i < WARP_VALS / 4; i++)
			if (i < nv) yr[32 * i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
	}
	return true;
}

// softmax_T(x, y, rows, cols, causal, log): a warp per row of at most
// WARP_COLS values, a block of 256 per longer row. The
// row max (NaN-propagating), then the sum of e^(x-max) over the unmasked
// columns in the lane order and tree; softmax writes e^(x-max)/sum,
// log_softmax (x-max) - log(sum); masked columns (causal = Sq > 0: row r
// is query r mod Sq, columns j > q + cols - Sq) get 0 and -Inf. A row whose
// unmasked values are all -Inf yields NaN.
template <typename T>
__device__ static void softmax_k(const T *x, T *y, u64 rows, u64 cols, u64 causal, u32 lg) {
	__shared__ float p[256];
	u32 t = threadIdx.x;
	if (cols <= WARP_COLS) {
		if (!softmax_warp4(x, y, rows, cols, causal, lg)) softmax_warp(x, y, rows, cols, causal, lg);
		return;
	}
	if (cols <= 256 * ROW_CACHE) {
		softmax_cached(x, y, rows, cols, causal, lg, p);
		return;
	}
	for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
		u64 lim = cols; // columns [0, lim) are unmasked
		if (causal > 0) lim = r % causal + (cols - causal) + 1;
		const u64 base = r * cols;
		float m = -F32_INF;
		for (u64 j = t; j < lim; j += 256) m = op_max(m, ld(x, base + j));
		m = tree_max(m, p);
		float s = 0.0f;
		for (u64 j = t; j < lim; j += 256) {
			float h, l;
			diff2(ld(x, base + j), m, &h, &l);
			s = __fadd_rn(s, exp2part(h, l));
		}
		s = tree_sum(s, p);
		float ls = logf(s);
		for (u64 j = t; j < cols; j += 256) {
			float v;
			if (j >= lim) {
				v = lg ? -F32_INF : 0.0f;
			} else {
				float h, l;
				diff2(ld(x, base + j), m, &h, &l);
				v = lg ? __fadd_rn(__fsub_rn(h, ls), l) : __fdiv_rn(exp2part(h, l), s);
			}
			st(y, base + j, v);
		}
	}
}

// layernorm_T(x, gamma, beta, y, rows, cols, eps): a warp per row of at
// most WARP_COLS values, a block of 256 per longer row. mean = tree sum / cols; var = tree sum of (x-mean)^2 / cols;
// y = ((x-mean) * rstd) * gamma + beta, each operation rounded.
template <typename T>
__device__ static void layernorm_k(const T *x, const T *g, const T *bt, T *y, u64 rows, u64 cols, float eps) {
	__shared__ float p[256];
	u32 t = threadIdx.x;
	if (cols <= WARP_COLS) {
		layernorm_warp(x, g, bt, y, rows, cols, eps);
		return;
	}
	if (cols <= 256 * ROW_CACHE) {
		for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
			const u64 base = r * cols;
			float v[ROW_CACHE];
			float s = 0.0f;
#pragma unroll
			for (int c = 0; c < ROW_CACHE; c++) {
				u64 j = t + 256 * (u64)c;
				v[c] = j < cols ? ld(x, base + j) : 0.0f;
				if (j < cols) s = __fadd_rn(s, v[c]);
			}
			float mean = __fdiv_rn(tree_sum(s, p), (float)cols);
			float q = 0.0f;
#pragma unroll
			for (int c = 0; c < ROW_CACHE; c++) {
				u64 j = t + 256 * (u64)c;
				if (j < cols) {
					float d = __fsub_rn(v[c], mean);
					q = __fadd_rn(q, __fmul_rn(d, d));
				}
			}
			float rs = rstd(__fdiv_rn(tree_sum(q, p), (float)cols), eps);
#pragma unroll
			for (int c = 0; c < ROW_CACHE; c++) {
				u64 j = t + 256 * (u64)c;
				if (j < cols) {
					float d = __fsub_rn(v[c], mean);
					st(y, base + j, __fadd_rn(__fmul_rn(__fmul_rn(d, rs), ld(g, j)), ld(bt, j)));
				}
			}
		}
		return;
	}
	for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
		const u64 base = r * cols;
		float s = 0.0f;
		for (u64 j = t; j < cols; j += 256) s = __fadd_rn(s, ld(x, base + j));
		float mean = __fdiv_rn(tree_sum(s, p), (float)cols);
		float q = 0.0f;
		for (u64 j = t; j < cols; j += 256) {
			float d = __fsub_rn(ld(x, base + j), mean);
			q = __fadd_rn(q, __fmul_rn(d, d));
		}
		float var = __fdiv_rn(tree_sum(q, p), (float)cols);
		float rs = rstd(var, eps);
		for (u64 j = t; j < cols; j += 256) {
			float d = __fsub_rn(ld(x, base + j), mean);
			st(y, base + j, __fadd_rn(__fmul_rn(__fmul_rn(d, rs), ld(g, j)), ld(bt, j)));
		}
	}
}

// rmsnorm_T(x, gamma, y, rows, cols, eps): ms = tree sum of x^2 / cols;
// y = (x * rstd(ms)) * gamma.
template <typename T>
__device__ static void rmsnorm_k(const T *x, const T *g, T *y, u64 rows, u64 cols, float eps) {
	__shared__ float p[256];
	u32 t = threadIdx.x;
	if (cols <= WARP_COLS) {
		rmsnorm_warp(x, g, y, rows, cols, eps);
		return;
	}
	if (cols <= 256 * ROW_CACHE) {
		for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
			const u64 base = r * cols;
			float v[ROW_CACHE];
			float q = 0.0f;
#pragma unroll
			for (int c = 0; c < ROW_CACHE; c++) {
				u64 j = t + 256 * (u64)c;
				v[c] = j < cols ? ld(x, base + j) : 0.0f;
				if (j < cols) q = __fadd_rn(q, __fmul_rn(v[c], v[c]));
			}
			float rs = rstd(__fdiv_rn(tree_sum(q, p), (float)cols), eps);
#pragma unroll
			for (int c = 0; c < ROW_CACHE; c++) {
				u64 j = t + 256 * (u64)c;
				if (j < cols) st(y, base + j, __fmul_rn(__fmul_rn(v[c], rs), ld(g, j)));
			}
		}
		return;
	}
	for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
		const u64 base = r * cols;
		float q = 0.0f;
		for (u64 j = t; j < cols; j += 256) {
			float v = ld(x, base + j);
			q = __fadd_rn(q, __fmul_rn(v, v));
		}
		float ms = __fdiv_rn(tree_sum(q, p), (float)cols);
		float rs = rstd(ms, eps);
		for (u64 j = t; j < cols; j += 256) st(y, base + j, __fmul_rn(__fmul_rn(ld(x, base + j), rs), ld(g, j)));
	}
}

// permute_bW(x, y, y0..y3, s0..s3): y has dims y0..y3 (row-major); element
// (i0,i1,i2,i3) of y is x's element at sum(ik * sk): the host passes x's
// strides in y's dim order (transpose). Copies W-bit words.
template <typename W>
__device__ static void permute_k(const W *x, W *y, u64 y0, u64 y1, u64 y2, u64 y3, u64 s0, u64 s1, u64 s2, u64 s3) {
	u64 n = y0 * y1 * y2 * y3;
	GRID_STRIDE(i, n) {
		u64 r = i;
		u64 i3 = r % y3;
		r /= y3;
		u64 i2 = r % y2;
		r /= y2;
		u64 i1 = r % y1;
		u64 i0 = r / y1;
		y[i] = x[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
	}
}

// gather_bW(table, idx, out, rows, cols, nidx): out row i = table row
// idx[i] (table is rows x cols); an index outside [0, rows) writes zeros.
template <typename W>
__device__ static void gather_k(const W *table, const int *idx, W *out, u64 rows, u64 cols, u64 nidx) {
	u64 n = nidx * cols;
	GRID_STRIDE(i, n) {
		u64 row = i / cols, col = i % cols;
		int k = idx[row];
		out[i] = (k >= 0 && (u64)k < rows) ? table[(u64)k * cols + col] : (W)0;
	}
}

// gemm_T(A, B, C, M, N, K, transA, transB, alpha, beta, batch, sA, sB, sC):
// C_b = alpha*op(A_b)*op(B_b) + beta*C_b for b < batch, row-major, X_b at
// element b*sX. Blocks of 256 threads compute 64x64 tiles of C (4x4 per
// thread) from 64x16 and 16x64 shared tiles; each C element's sum runs
// over k in order from 0, products rounded before each add, then
// alpha*sum is rounded, then beta*c (rounded) is added, never fused; C is
// not read when beta is 0.
#define GT 64
#define GK 16

template <typename T>
__device__ static void gemm_k(const T *A, const T *B, T *C, u32 M, u32 N, u32 K, u32 ta, u32 tb, float alpha,
			      float beta, u32 batch, u64 sA, u64 sB, u64 sC) {
	__shared__ float As[GK][GT + 1];
	__shared__ float Bs[GK][GT + 1];
	u32 t = threadIdx.x;
	u32 tx = t % 16, ty = t / 16;
	u64 tm = (M + GT - 1) / GT, tn = (N + GT - 1) / GT;
	u64 tiles = (u64)batch * tm * tn;
	for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
		u64 b = tile / (tm * tn);
		u64 rem = tile % (tm * tn);
		u64 row0 = (rem / tn) * GT, col0 = (rem % tn) * GT;
		const T *Ab = A + b * sA;
		const T *Bb = B + b * sB;
		float acc[4][4];
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
		for (u32 k0 = 0; k0 < K; k0 += GK) {
			// Load 64 rows x 16 k of op(A) and 16 k x 64 cols of op(B).
			for (u32 e = t; e < GT * GK; e += 256) {
				u32 kk, ii;
				if (ta) {
					kk = e / GT;
					ii = e % GT;
				} else {
					ii = e / GK;
					kk = e % GK;
				}
				u64 gi = row0 + ii, gk = (u64)k0 + kk;
				float v = 0.0f;
				if (gi < M && gk < K) v = ld(Ab, ta ? gk * M + gi : gi * K + gk);
				As[kk][ii] = v;
				u32 jj;
				if (tb) {
					jj = e / GK;
					kk = e % GK;
				} else {
					kk = e / GT;
					jj = e % GT;
				}
				u64 gj = col0 + jj;
				gk = (u64)k0 + kk;
				float w = 0.0f;
				if (gj < N && gk < K) w = ld(Bb, tb ? gj * K + gk : gk * N + gj);
				Bs[kk][jj] = w;
			}
			__syncthreads();
			u32 kn = min((u32)GK, K - k0);
			for (u32 kk = 0; kk < kn; kk++) {
				float av[4], bv[4];
				for (int i = 0; i < 4; i++) av[i] = As[kk][ty * 4 + i];
				for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx * 4 + j];
				for (int i = 0; i < 4; i++)
					for (int j = 0; j < 4; j++) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(av[i], bv[j]));
			}
			__syncthreads();
		}
		T *Cb = C + b * sC;
		for (int i = 0; i < 4; i++) {
			u64 gi = row0 + ty * 4 + i;
			if (gi >= M) continue;
			for (int j = 0; j < 4; j++) {
				u64 gj = col0 + tx * 4 + j;
				if (gj >= N) continue;
				float v = __fmul_rn(alpha, acc[i][j]);
				if (beta != 0.0f) v = __fadd_rn(v, __fmul_rn(beta, ld(Cb, gi * N + gj)));
				st(Cb, gi * N + gj, v);
			}
		}
	}
}

// conv2d_f32(x, w, bias, y, N, C, H, W, K, R, S, stride, pad, dil, groups,
// P, Q): NCHW; stride, pad and dil pack (h | w<<32); w is K x C/groups x R
// x S; bias is K values or null. One thread per output: the sum over c,
// then r, then s ascending from 0 of the rounded products, padding
// skipped, then + bias[k].
extern "C" __global__ void conv2d_f32(const float *x, const float *w, const float *bias, float *y, u32 N, u32 C,
				      u32 H, u32 W, u32 K, u32 R, u32 S, u64 stride, u64 pad, u64 dil, u32 groups,
				      u32 P, u32 Q) {
	u64 sh = stride & 0xffffffffu, sw = stride >> 32;
	long long ph = (long long)(pad & 0xffffffffu), pw = (long long)(pad >> 32);
	u64 dh = dil & 0xffffffffu, dw = dil >> 32;
	u32 cg = C / groups, kg = K / groups;
	u64 n = (u64)N * K * P * Q;
	GRID_STRIDE(i, n) {
		u64 r0 = i;
		u64 q = r0 % Q;
		r0 /= Q;
		u64 pp = r0 % P;
		r0 /= P;
		u64 k = r0 % K;
		u64 nn = r0 / K;
		u64 g = k / kg;
		float acc = 0.0f;
		for (u32 c = 0; c < cg; c++) {
			const float *xc = x + ((nn * C + g * cg + c) * H) * W;
			const float *wc = w + ((k * cg + c) * R) * S;
			for (u32 r = 0; r < R; r++) {
				long long hi = (long long)(pp * sh) - ph + (long long)(r * dh);
				if (hi < 0 || hi >= (long long)H) continue;
				for (u32 s = 0; s < S; s++) {
					long long wi = (long long)(q * sw) - pw + (long long)(s * dw);
					if (wi < 0 || wi >= (long long)W) continue;
					acc = __fadd_rn(acc, __fmul_rn(xc[hi * W + wi], wc[r * S + s]));
				}
			}
		}
		if (bias) acc = __fadd_rn(acc, bias[k]);
		y[i] = acc;
	}
}

// pool2d_f32(x, y, N, C, H, W, R, S, stride, pad, P, Q, avg): NCHW max or
// average pooling; stride and pad pack (h | w<<32). Padding is skipped:
// max starts from -Inf (NaN propagates, as max does), avg divides the sum
// (r then s ascending from 0) by the count of values inside the input
// (0 when the window lies in the padding).
extern "C" __global__ void pool2d_f32(const float *x, float *y, u32 N, u32 C, u32 H, u32 W, u32 R, u32 S, u64 stride,
				      u64 pad, u32 P, u32 Q, u32 avg) {
	u64 sh = stride & 0xffffffffu, sw = stride >> 32;
	long long ph = (long long)(pad & 0xffffffffu), pw = (long long)(pad >> 32);
	u64 n = (u64)N * C * P * Q;
	GRID_STRIDE(i, n) {
		u64 r0 = i;
		u64 q = r0 % Q;
		r0 /= Q;
		u64 pp = r0 % P;
		u64 nc = r0 / P;
		const float *xc = x + nc * H * W;
		float acc = avg ? 0.0f : -F32_INF;
		u32 cnt = 0;
		for (u32 r = 0; r < R; r++) {
			long long hi = (long long)(pp * sh) - ph + r;
			if (hi < 0 || hi >= (long long)H) continue;
			for (u32 s = 0; s < S; s++) {
				long long wi = (long long)(q * sw) - pw + s;
				if (wi < 0 || wi >= (long long)W) continue;
				float v = xc[hi * W + wi];
				acc = avg ? __fadd_rn(acc, v) : op_max(acc, v);
				cnt++;
			}
		}
		if (avg) acc = cnt ? __fdiv_rn(acc, (float)cnt) : 0.0f;
		y[i] = acc;
	}
}

// cast(x, y, n, from, to): dtype codes 0 f32, 1 f16, 2 bf16, 3 i32.
// Float to float rounds to nearest even (NaN stays NaN, overflow gives
// Inf); float to i32 truncates toward zero, saturates, NaN gives 0; i32 to
// float rounds to nearest even, directly (never through float32 first).
__device__ static __forceinline__ int f2i_sat(float v) {
	if (isnanf_(v)) return 0;
	if (v >= 2147483648.0f) return 2147483647;
	if (v <= -2147483648.0f) return (int)0x80000000;
	return __float2int_rz(v);
}

extern "C" __global__ void cast(const void *x, void *y, u64 n, u32 from, u32 to) {
	GRID_STRIDE(i, n) {
		if (from == 3) {
			int v = ((const int *)x)[i];
			switch (to) {
			case 0: ((float *)y)[i] = __int2float_rn(v); break;
			case 1: ((f16 *)y)[i] = __int2half_rn(v); break;
			case 2: ((bf16 *)y)[i] = __int2bfloat16_rn(v); break;
			case 3: ((int *)y)[i] = v; break;
			}
			continue;
		}
		float v;
		switch (from) {
		case 0: v = ((const float *)x)[i]; break;
		case 1: v = __half2float(((const f16 *)x)[i]); break;
		default: v = __bfloat162float(((const bf16 *)x)[i]); break;
		}
		switch (to) {
		case 0: ((float *)y)[i] = v; break;
		case 1: ((f16 *)y)[i] = __float2half_rn(v); break;
		case 2: ((bf16 *)y)[i] = __float2bfloat16_rn(v); break;
		case 3: ((int *)y)[i] = f2i_sat(v); break;
		}
	}
}

// SOFTMAX_MINB > 0 asks the compiler to fit that many blocks of 256
// threads per SM for softmax (__launch_bounds__; 4, the default); 0 leaves
// the registers to it.
#ifndef SOFTMAX_MINB
#define SOFTMAX_MINB 4
#endif
#if SOFTMAX_MINB > 0
#define SOFTMAX_BOUNDS __launch_bounds__(256, SOFTMAX_MINB)
#else
#define SOFTMAX_BOUNDS
#endif

// The extern "C" entries, one per op family and storage type.
#define STORAGE_ENTRIES(T, SUF)                                                                                     \
	extern "C" __global__ void unary_##SUF(const T *x, T *y, u64 n, u32 op) { unary_k(x, y, n, op); }          \
	extern "C" __global__ void affine_##SUF(const T *x, T *y, u64 n, float a, float b) {                        \
		affine_k(x, y, n, a, b);                                                                          \
	}                                                                                                         \
	extern "C" __global__ void binary_##SUF(const T *a, const T *b, T *c, u32 op, u64 c0, u64 c1, u64 c2,        \
						u64 c3, u64 sa0, u64 sa1, u64 sa2, u64 sa3, u64 sb0, u64 sb1, \
						u64 sb2, u64 sb3) {                                           \
		binary_k(a, b, c, op, c0, c1, c2, c3, sa0, sa1, sa2, sa3, sb0, sb1, sb2, sb3);                    \
	}                                                                                                         \
	extern "C" __global__ void reduce_##SUF(const T *x, void *y, u64 outer, u64 n, u64 inner, u32 op) {         \
		reduce_k(x, y, outer, n, inner, op);                                                              \
	}                                                                                                         \
	extern "C" __global__ void SOFTMAX_BOUNDS softmax_##SUF(const T *x, T *y, u64 rows, u64 cols, u64 causal,    \
								 u32 lg) {                                         \
		softmax_k(x, y, rows, cols, causal, lg);                                                          \
	}                                                                                                         \
	extern "C" __global__ void layernorm_##SUF(const T *x, const T *g, const T *b, T *y, u64 rows, u64 cols,    \
						   float eps) {                                                   \
		layernorm_k(x, g, b, y, rows, cols, eps);                                                         \
	}                                                                                                         \
	extern "C" __global__ void rmsnorm_##SUF(const T *x, const T *g, T *y, u64 rows, u64 cols, float eps) {     \
		rmsnorm_k(x, g, y, rows, cols, eps);                                                              \
	}                                                                                                         \
	extern "C" __global__ void gemm_##SUF(const T *A, const T *B, T *C, u32 M, u32 N, u32 K, u32 ta, u32 tb,    \
					      float alpha, float beta, u32 batch, u64 sA, u64 sB, u64 sC) {       \
		gemm_k(A, B, C, M, N, K, ta, tb, alpha, beta, batch, sA, sB, sC);                                 \
	}

STORAGE_ENTRIES(float, f32)
STORAGE_ENTRIES(f16, f16)
STORAGE_ENTRIES(bf16, bf16)

extern "C" __global__ void permute_b32(const u32 *x, u32 *y, u64 y0, u64 y1, u64 y2, u64 y3, u64 s0, u64 s1, u64 s2,
				       u64 s3) {
	permute_k(x, y, y0, y1, y2, y3, s0, s1, s2, s3);
}

extern "C" __global__ void permute_b16(const unsigned short *x, unsigned short *y, u64 y0, u64 y1, u64 y2, u64 y3,
				       u64 s0, u64 s1, u64 s2, u64 s3) {
	permute_k(x, y, y0, y1, y2, y3, s0, s1, s2, s3);
}

extern "C" __global__ void gather_b32(const u32 *table, const int *idx, u32 *out, u64 rows, u64 cols, u64 nidx) {
	gather_k(table, idx, out, rows, cols, nidx);
}
