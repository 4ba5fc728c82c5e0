/*
 * matmul: a loop-heavy stage for measuring the cost of interruption. It
 * multiplies two 64x64 float matrices `reps` times (reps from the input,
 * a little-endian u32; 1 if there is none) and outputs the checksum of
 * the result as a little-endian float32. The compute kernel is also
 * exported as `matmul(reps) -> f32`, so a benchmark can call it directly
 * on a plain, uninstrumented instance.
 *
 * Built by build.sh: clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry.
 */
#include "stagehost.h"

STAGEHOST_ABI_V1();

#define N 64

static float a[N * N], b[N * N], c[N * N];

STAGEHOST_EXPORT("matmul") float matmul(int32_t reps) {
	for (int i = 0; i < N * N; i++) {
		a[i] = (float)(i % 7) * 0.25f;
		b[i] = (float)(i % 5) * 0.5f;
	}
	float sum = 0;
	for (int32_t r = 0; r < reps; r++) {
		for (int i = 0; i < N; i++) {
			for (int j = 0; j < N; j++) {
				float acc = 0;
				for (int k = 0; k < N; k++) {
					acc += a[i * N + k] * b[k * N + j];
				}
				c[i * N + j] = acc;
			}
		}
		sum += c[r % (N * N)];
		a[r % (N * N)] += 1.0f; /* so repetitions are not folded together */
	}
	return sum;
}

STAGEHOST_EXPORT("stagehost_run") int32_t run(void) {
	uint32_t reps = 1, len = 0, got = 0;
	if (stagehost_input_size(&len) == STAGEHOST_OK && len >= 4) {
		stagehost_input_read(0, &reps, 4, &got);
	}
	float sum = matmul((int32_t)reps);
	return stagehost_output_write(&sum, 4);
}
