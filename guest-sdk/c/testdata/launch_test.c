/*
 * stagehost_stream_launch on the C emulator, emu.c: it links, and it
 * refuses a built-in program with the host's status and last error (the
 * C emulator declares no vendor kernels), after the stream and program
 * handles. Prints "ok" and exits 0 when every refusal is the host's.
 *
 *   cc -std=c11 -I.. launch_test.c ../emu.c -lm && ./a.out
 */
#include "stagehost.h"

#include <stdio.h>
#include <string.h>

static const char *failed;

static int32_t stage(void) {
	stagehost_handle s, fill, out;
	uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
	char msg[STAGEHOST_MAX_ERROR_MESSAGE + 1];
	if (stagehost_stream_get("s0", 2, &s) || stagehost_program_get("fill", 4, &fill) || stagehost_buffer_get("out", 3, &out)) {
		failed = "lookups";
		return 1;
	}
	stagehost_arg a[2] = {stagehost_whole(out), stagehost_f32(1.0f)};
	if (stagehost_stream_launch(s, fill, grid, block, 0, a, 2) != STAGEHOST_INVALID_ARGUMENT) {
		failed = "a built-in program: not INVALID_ARGUMENT";
		return 1;
	}
	stagehost_last_error_str(msg, sizeof msg);
	if (strcmp(msg, "program \"fill\" is built in: stream_launch launches vendor kernels; use stream_submit") != 0) {
		failed = "a built-in program: the last error";
		fprintf(stderr, "last error %s\n", msg);
		return 1;
	}
	if (stagehost_stream_launch(s, out, grid, block, 0, a, 2) != STAGEHOST_BAD_HANDLE) {
		failed = "a buffer handle as the program: not BAD_HANDLE";
		return 1;
	}
	if (stagehost_stream_launch(fill, fill, grid, block, 0, a, 2) != STAGEHOST_BAD_HANDLE) {
		failed = "a program handle as the stream: not BAD_HANDLE";
		return 1;
	}
	if (stagehost_stream_launch(s, fill, NULL, block, 0, a, 2) != STAGEHOST_OUT_OF_BOUNDS) {
		failed = "no grid: not OUT_OF_BOUNDS";
		return 1;
	}
	return 0;
}

int main(void) {
	stagehost_emu *e = stagehost_emu_new();
	stagehost_emu_stream(e, "s0");
	stagehost_emu_buffer(e, "out", 4);
	stagehost_emu_program(e, "fill");
	stagehost_emu_result r = stagehost_emu_run(e, NULL, NULL, 0, stage);
	if (r.outcome != STAGEHOST_EMU_OK) {
		fprintf(stderr, "stream_launch: %s (%s)\n", failed ? failed : "the run failed", r.message);
		return 1;
	}
	stagehost_emu_free(e);
	puts("ok");
	return 0;
}
