/*
 * cstage: a stagehost stage in C. It reads its input, fills a 64-byte
 * device buffer with 2.5 on stream "s0" (program "fill"), reads it back and
 * outputs the sum of the 16 floats as a little-endian float32: 40.0.
 *
 * Build (see ../build.sh), in this folder:
 *   clang --target=wasm32 -O2 -nostdlib -I../../../guest-sdk/c \
 *     -Wl,--no-entry -o cstage.wasm cstage.c
 * -nostdlib: no libc (the header needs only <stdint.h>); --no-entry: a
 * reactor without _start. The header's export_name attributes export
 * stagehost_abi_v1 and stagehost_run, and wasm-ld exports memory by
 * default; nothing is imported but stagehost_v1 functions.
 */
#include "stagehost.h"

STAGEHOST_ABI_V1();

static uint8_t input[256];

/* fail reports msg as the stage's error message and returns status, or 1
 * if status is 0. */
static int32_t fail(const char *msg, stagehost_status status) {
	stagehost_error_set(msg, stagehost_strlen(msg));
	return status != STAGEHOST_OK ? status : 1;
}

static void log_info(const char *msg) {
	stagehost_log(STAGEHOST_LOG_INFO, msg, stagehost_strlen(msg));
}

STAGEHOST_EXPORT("stagehost_run") int32_t run(void) {
	stagehost_status st;

	/* The input: up to sizeof input bytes, kept only to show the calls. */
	uint32_t in_len = 0, got = 0;
	if ((st = stagehost_input_size(&in_len)) != STAGEHOST_OK) {
		return fail("cstage: input_size failed", st);
	}
	if (in_len > sizeof input) {
		return fail("cstage: input longer than 256 bytes", STAGEHOST_INVALID_ARGUMENT);
	}
	for (uint32_t off = 0; off < in_len; off += got) {
		if ((st = stagehost_input_read(off, input + off, in_len - off, &got)) != STAGEHOST_OK) {
			return fail("cstage: input_read failed", st);
		}
		if (got == 0) {
			return fail("cstage: short input", STAGEHOST_FAULT);
		}
	}

	stagehost_handle stream, fill, buf;
	if ((st = stagehost_stream_get("s0", 2, &stream)) != STAGEHOST_OK) {
		return fail("cstage: no stream s0", st);
	}
	if ((st = stagehost_program_get("fill", 4, &fill)) != STAGEHOST_OK) {
		return fail("cstage: no program fill", st);
	}
	if ((st = stagehost_buffer_alloc(64, &buf)) != STAGEHOST_OK) {
		return fail("cstage: buffer_alloc failed", st);
	}

	stagehost_arg args[2] = {stagehost_whole(buf), stagehost_f32(2.5f)};
	if ((st = stagehost_stream_submit(stream, fill, args, 2)) != STAGEHOST_OK) {
		stagehost_buffer_free(buf);
		return fail("cstage: submit failed", st);
	}
	if ((st = stagehost_stream_sync(stream)) != STAGEHOST_OK) {
		stagehost_buffer_free(buf);
		return fail("cstage: fill failed", st);
	}
	float values[16];
	if ((st = stagehost_stream_read(stream, buf, 0, values, sizeof values)) != STAGEHOST_OK) {
		stagehost_buffer_free(buf);
		return fail("cstage: read failed", st);
	}
	stagehost_buffer_free(buf);

	float sum = 0;
	for (int i = 0; i < 16; i++) {
		sum += values[i];
	}
	log_info("cstage: filled and summed 16 floats");
	/* wasm32 is little-endian: the float's bytes are the output. */
	if ((st = stagehost_output_write(&sum, sizeof sum)) != STAGEHOST_OK) {
		return fail("cstage: output_write failed", st);
	}
	return 0;
}
