// launch.c: the noop-launch loops of hw/cuda's benchmarks, written in C
// against the CUDA driver API, so the Go backend (purego, one driver
// thread per stream) can be compared side by side with plain C.
//
// It loads the same module as the Go backend (hw/cuda/kernels/kernels.ptx)
// and runs the kernel "noop" on a non-blocking stream of the primary
// context.
//
// Build and run (from the repository root, on a machine with CUDA):
//
//	nvcc -O2 -o /tmp/launch bench/cuda/launch.c -lcuda
//	/tmp/launch hw/cuda/kernels/kernels.ptx [repetitions]
//
// Each measurement runs 3 times (or the given number); lines are
// "name  ns/unit".
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
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static char *read_file(const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc(n + 1);
	if (fread(buf, 1, n, f) != (size_t)n) {
		perror("read");
		exit(1);
	}
	buf[n] = 0;
	fclose(f);
	return buf;
}

static CUfunction noop;
static CUstream stream;

static void launch(void) {
	CHECK(cuLaunchKernel(noop, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
}

// async: n launches, one cuStreamSynchronize at the end.
static double bench_async(int n) {
	double t0 = now_ns();
	for (int i = 0; i < n; i++) launch();
	CHECK(cuStreamSynchronize(stream));
	return (now_ns() - t0) / n;
}

// async with a cuEventRecord after every launch (hw/cuda records one per
// burst; this is its worst case).
static double bench_async_event(int n, CUevent *evs, int nev) {
	double t0 = now_ns();
	for (int i = 0; i < n; i++) {
		launch();
		CHECK(cuEventRecord(evs[i % nev], stream));
	}
	CHECK(cuStreamSynchronize(stream));
	return (now_ns() - t0) / n;
}

// sync: launch + cuStreamSynchronize.
static double bench_sync(int n) {
	double t0 = now_ns();
	for (int i = 0; i < n; i++) {
		launch();
		CHECK(cuStreamSynchronize(stream));
	}
	return (now_ns() - t0) / n;
}

// poll: launch + cuEventRecord + spin on cuEventQuery (hw/cuda's wait).
static double bench_poll(int n, CUevent ev) {
	double t0 = now_ns();
	for (int i = 0; i < n; i++) {
		launch();
		CHECK(cuEventRecord(ev, stream));
		CUresult r;
		while ((r = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY) {
		}
		CHECK(r);
	}
	return (now_ns() - t0) / n;
}

// graph: replays of a 64-noop graph, one sync at the end; per kernel.
static double bench_graph(int n, CUgraphExec exec, int kernels) {
	double t0 = now_ns();
	for (int i = 0; i < n; i++) CHECK(cuGraphLaunch(exec, stream));
	CHECK(cuStreamSynchronize(stream));
	return (now_ns() - t0) / ((double)n * kernels);
}

int main(int argc, char **argv) {
	const char *path = argc > 1 ? argv[1] : "hw/cuda/kernels/kernels.ptx";
	int reps = argc > 2 ? atoi(argv[2]) : 3;
	if (reps < 1) reps = 1;
	char *ptx = read_file(path);
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	char name[256];
	CHECK(cuDeviceGetName(name, sizeof name, dev));
	int ver = 0;
	CHECK(cuDriverGetVersion(&ver));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuModuleLoadDataEx(&mod, ptx, 0, NULL, NULL));
	CHECK(cuModuleGetFunction(&noop, mod, "noop"));
	CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
	printf("device %s, driver %d, module %s\n", name, ver, path);

	enum { NEV = 64, GK = 64 };
	CUevent evs[NEV];
	for (int i = 0; i < NEV; i++) CHECK(cuEventCreate(&evs[i], CU_EVENT_DISABLE_TIMING));

	CUgraph graph;
	CUgraphExec exec;
	CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
	for (int i = 0; i < GK; i++) launch();
	CHECK(cuStreamEndCapture(stream, &graph));
	CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));

	// Warm up.
	bench_async(2000);
	bench_sync(200);
	bench_graph(50, exec, GK);

	for (int rep = 0; rep < reps; rep++) {
		printf("c_async_launch        %8.0f ns/launch\n", bench_async(100000));
		printf("c_async_launch_event  %8.0f ns/launch\n", bench_async_event(100000, evs, NEV));
		printf("c_launch_sync         %8.0f ns/launch\n", bench_sync(20000));
		printf("c_launch_event_poll   %8.0f ns/launch\n", bench_poll(20000, evs[0]));
		printf("c_graph_64_noop       %8.1f ns/kernel\n", bench_graph(2000, exec, GK));
	}

	CHECK(cuGraphExecDestroy(exec));
	CHECK(cuGraphDestroy(graph));
	for (int i = 0; i < NEV; i++) CHECK(cuEventDestroy(evs[i]));
	CHECK(cuStreamDestroy(stream));
	CHECK(cuModuleUnload(mod));
	CHECK(cuDevicePrimaryCtxRelease(dev));
	free(ptx);
	return 0;
}
