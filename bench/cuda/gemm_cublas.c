// gemm_cublas.c: the reference numbers for the op library's benchmark
// (bench/cuda/ops): cuBLAS called directly from C, with the same calls the
// fast tier makes through purego (cublasGemmStridedBatchedEx, float32
// compute, default math without TF32, batch 1), plus a device-to-device
// copy's bandwidth, the ceiling of the memory-bound ops.
//
// Build and run (on a machine with the CUDA toolkit):
//
//	nvcc -O2 -o /tmp/gemm_cublas bench/cuda/gemm_cublas.c -lcublas
//	/tmp/gemm_cublas [size] [repetitions]
//
// size defaults to 4096 (M = N = K), repetitions to 10. Lines are
// "name  value unit".
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                          \
	do {                                                                           \
		cudaError_t e_ = (x);                                                  \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,     \
				cudaGetErrorName(e_));                                 \
			exit(1);                                                       \
		}                                                                      \
	} while (0)
#define CB(x)                                                                          \
	do {                                                                           \
		cublasStatus_t s_ = (x);                                               \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                     \
			fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, \
				(int)s_);                                              \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static float gemm(cublasHandle_t h, cudaStream_t st, cudaDataType t, int n, int reps) {
	size_t es = t == CUDA_R_32F ? 4 : 2;
	void *a, *b, *c;
	CK(cudaMalloc(&a, es * n * n));
	CK(cudaMalloc(&b, es * n * n));
	CK(cudaMalloc(&c, es * n * n));
	CK(cudaMemset(a, 0x3c, es * n * n)); // ~1.0-ish values in every type
	CK(cudaMemset(b, 0x3c, es * n * n));
	float alpha = 1, beta = 0;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int warm = 0; warm < 2; warm++)
		CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b, t, n, 0, a, t, n, 0, &beta, c,
					      t, n, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	CK(cudaEventRecord(e0, st));
	for (int i = 0; i < reps; i++)
		CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b, t, n, 0, a, t, n, 0, &beta, c,
					      t, n, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	CK(cudaEventRecord(e1, st));
	CK(cudaEventSynchronize(e1));
	float ms;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	CK(cudaFree(a));
	CK(cudaFree(b));
	CK(cudaFree(c));
	return 2.0f * n * (float)n * n * reps / (ms * 1e-3f) / 1e9f;
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 4096;
	int reps = argc > 2 ? atoi(argv[2]) : 10;
	cublasHandle_t h;
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CB(cublasCreate(&h));
	CB(cublasSetStream(h, st));
	CB(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
	int v = 0;
	cublasGetVersion(h, &v);
	printf("cublas_version %d\n", v);
	printf("gemm_f32_%d_cublas_c %.1f GFLOP/s\n", n, gemm(h, st, CUDA_R_32F, n, reps));
	printf("gemm_bf16_%d_cublas_c %.1f GFLOP/s\n", n, gemm(h, st, CUDA_R_16BF, n, reps));
	printf("gemm_f16_%d_cublas_c %.1f GFLOP/s\n", n, gemm(h, st, CUDA_R_16F, n, reps));

	// Device-to-device copy of 256 MiB: bytes read + written per second.
	size_t bytes = 256u << 20;
	void *x, *y;
	CK(cudaMalloc(&x, bytes));
	CK(cudaMalloc(&y, bytes));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st));
	CK(cudaEventRecord(e0, st));
	for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st));
	CK(cudaEventRecord(e1, st));
	CK(cudaEventSynchronize(e1));
	float ms;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	printf("d2d_copy_256MiB %.1f GB/s\n", 2.0 * bytes * reps / (ms * 1e-3) / 1e9);
	CB(cublasDestroy(h));
	return 0;
}
