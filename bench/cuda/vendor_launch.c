// vendor_launch.c: the C side of the vendor-kernel launch benchmark: the
// PTX kernel "double" (hw/cuda/testdata/vendor/double.ptx: x f32 in,
// y f32 out, n u32) launched COUNT times on a non-blocking stream of the
// primary context with grid ((n+255)/256) and block 256, then one
// cuStreamSynchronize, exactly what ../vendor_launch.wat does through
// stream_launch (bench/cuda/wasmlaunch/vendor_test.go). Prints
// "vendor_launch  ns/launch" per repetition.
//
// Build and run (from the repository root, on a machine with CUDA):
//
//	nvcc -O2 -o /tmp/vendor_launch bench/cuda/vendor_launch.c -lcuda
//	/tmp/vendor_launch hw/cuda/testdata/vendor/double.ptx [repetitions]
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                  \
	do {                                                                          \
		CUresult r_ = (x);                                                        \
		if (r_ != CUDA_SUCCESS) {                                                 \
			const char *n_ = NULL;                                                \
			cuGetErrorName(r_, &n_);                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, n_ ? n_ : "?"); \
			exit(1);                                                              \
		}                                                                         \
	} while (0)

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static char *slurp(const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f) { perror(path); exit(1); }
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(n + 1);
	if (fread(b, 1, n, f) != (size_t)n) { perror(path); exit(1); }
	b[n] = 0;
	fclose(f);
	return b;
}

int main(int argc, char **argv) {
	if (argc < 2) { fprintf(stderr, "usage: %s double.ptx [repetitions]\n", argv[0]); return 2; }
	int reps = argc > 2 ? atoi(argv[2]) : 3;
	const unsigned count = 1000, n = 1024;
	CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUstream s;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	char *ptx = slurp(argv[1]);
	CHECK(cuModuleLoadDataEx(&mod, ptx, 0, NULL, NULL));
	CHECK(cuModuleGetFunction(&fn, mod, "double"));
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CUdeviceptr x, y;
	CHECK(cuMemAlloc(&x, 4 * n));
	CHECK(cuMemAlloc(&y, 4 * n));
	CHECK(cuMemsetD8(x, 0, 4 * n));
	void *params[] = {&x, &y, (void *)&n};
	for (int r = -1; r < reps; r++) { // r = -1: warm-up
		double t0 = now_ns();
		for (unsigned i = 0; i < count; i++)
			CHECK(cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
		CHECK(cuStreamSynchronize(s));
		double dt = now_ns() - t0;
		if (r >= 0) printf("vendor_launch  %.0f ns/launch\n", dt / count);
	}
	return 0;
}
