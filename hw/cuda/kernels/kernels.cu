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
