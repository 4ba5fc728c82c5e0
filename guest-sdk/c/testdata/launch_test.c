/*
 * Vendor kernels (stagehost_stream_launch, revision 4) on the C emulator,
 * emu.c: a declared kernel runs; a built-in program, a vendor kernel
 * given to stream_submit or a batch, a shape over the sim devices' fixed
 * limits, every argument that does not match the declaration, and
 * read-only weights where the kernel writes are refused with the host's
 * statuses and last errors; declarations the emulator refuses name the
 * reason. Prints "ok" and exits 0 when every row agrees.
 *
 *   cc -std=c11 -I.. launch_test.c ../emu.c -lm && ./a.out
 */
#include "stagehost.h"

#include <stdio.h>
#include <string.h>

/* store: writes the u32 scalar of argument 1 into the first 4 bytes of
 * buffer argument 0. */
static int store(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	if (n != 2 || !a[0].bytes || a[0].len < 4) {
		snprintf(why, cap, "store: bad arguments");
		return 1;
	}
	uint32_t v = (uint32_t)a[1].value;
	memcpy(a[0].bytes, &v, 4);
	return 0;
}

/* copy: buffer argument 0 into buffer argument 1. */
static int copy(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n, (void)why, (void)cap;
	memcpy(a[1].bytes, a[0].bytes, a[1].len < a[0].len ? a[1].len : a[0].len);
	return 0;
}

/* broken: always fails. */
static int broken(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)a, (void)n;
	snprintf(why, cap, "the stand-in refuses");
	return 1;
}

static const stagehost_emu_vendor_arg store_args[] = {{"out", "buffer", "f32", "out"}, {"v", "u32", NULL, NULL}};
static const stagehost_emu_vendor_arg copy_args[] = {{"x", "buffer", "f32", "in"}, {"y", "buffer", NULL, "inout"}};
static const stagehost_emu_vendor_arg scalar_args[] = {
    {"a", "u64", NULL, NULL}, {"b", "i32", NULL, NULL}, {"c", "f32", NULL, NULL}, {"d", "buffer", "bytes", "out"}};

/* The rows: what the stage launches (see stage) and what it must get
 * (CLOSED, which nothing here returns, marks a wrong result). */
static const struct {
	const char *what;
	stagehost_status want;
	const char *lasterr; /* exact; NULL: not checked */
} rows[] = {
    {"runs", STAGEHOST_OK, NULL},
    {"built in", STAGEHOST_INVALID_ARGUMENT, "program \"fill\" is built in: stream_launch launches vendor kernels; use stream_submit"},
    {"submit", STAGEHOST_INVALID_ARGUMENT,
     "program \"store\" is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)"},
    {"batch", STAGEHOST_INVALID_ARGUMENT,
     "command 1: program \"store\" is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md "
     "§3.5)"},
    {"zero dim", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: grid [1 0 1], block [1 1 1]: every dimension is at least 1"},
    {"block.z", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: block.z = 65, over the device's limit of 64"},
    {"grid.y", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: grid.y = 65536, over the device's limit of 65535"},
    {"threads", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: block [512 4 1] is 2048 threads, over the device's limit of 1024 per block"},
    {"shared", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: 49153 bytes of shared memory, over the device's limit of 49152"},
    {"shape first", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": launch shape: block.x = 2048, over the device's limit of 1024"},
    {"count", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\" takes 2 arguments, got 1"},
    {"scalar for a buffer", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 0 (out) is a buffer (f32, out), got a scalar"},
    {"buffer for a scalar", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 1 (v) is a u32 scalar, got a buffer"},
    {"length", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 0 (out): 3 bytes is not a whole number of f32 values"},
    {"u32 over", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 1 (v): 0x100000000 does not fit a u32"},
    {"i32 over", STAGEHOST_INVALID_ARGUMENT, "kernel \"scalars\": argument 1 (b): 0x100000000 does not fit a i32"},
    {"scalars", STAGEHOST_OK, NULL},
    {"weights out", STAGEHOST_INVALID_ARGUMENT,
     "store: argument 0 is the read-only weights \"w\", but the kernel's argument 0 is written (direction out)"},
    {"weights inout", STAGEHOST_INVALID_ARGUMENT,
     "copy: argument 1 is the read-only weights \"w\", but the kernel's argument 1 is written (direction inout)"},
    {"weights past", STAGEHOST_INVALID_ARGUMENT,
     "store: argument 2 is the read-only weights \"w\", but the kernel's argument 2 is not described as read only"},
    {"weights for a scalar", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 1 (v) is a u32 scalar, got a buffer"},
    {"weights in", STAGEHOST_OK, NULL},
    {"stand-in fails", STAGEHOST_FAULT, NULL},
};

static int row;
static char got_err[STAGEHOST_MAX_ERROR_MESSAGE + 1];
static stagehost_status got;

static int32_t stage(void) {
	stagehost_handle s, st, cp, sc, br, fill, out, w;
	if (stagehost_stream_get("s0", 2, &s) || stagehost_program_get("store", 5, &st) || stagehost_program_get("copy", 4, &cp) ||
	    stagehost_program_get("scalars", 7, &sc) || stagehost_program_get("broken", 6, &br) || stagehost_program_get("fill", 4, &fill) ||
	    stagehost_buffer_get("out", 3, &out) || stagehost_weights_get("w", 1, &w)) {
		return 1;
	}
	uint32_t one[3] = {1, 1, 1};
	const char *what = rows[row].what;
	stagehost_arg ok2[2] = {stagehost_whole(out), stagehost_u32(42)};
	stagehost_status r;
	if (!strcmp(what, "runs")) {
		r = stagehost_stream_launch(s, st, (uint32_t[3]){65535, 1, 1}, (uint32_t[3]){256, 4, 1}, 48 << 10, ok2, 2);
		if (r == STAGEHOST_OK && (r = stagehost_stream_sync(s)) == STAGEHOST_OK) {
			uint32_t v = 0;
			r = stagehost_stream_read(s, out, 0, &v, 4);
			if (r == STAGEHOST_OK && v != 42) {
				r = STAGEHOST_CLOSED;
			}
		}
	} else if (!strcmp(what, "built in")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_f32(1.0f)};
		r = stagehost_stream_launch(s, fill, one, one, 0, a, 2);
	} else if (!strcmp(what, "submit")) {
		r = stagehost_stream_submit(s, st, ok2, 2);
	} else if (!strcmp(what, "batch")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_f32(1.0f)};
		stagehost_command c[2] = {{fill, stagehost_args_ptr(a), 2}, {st, stagehost_args_ptr(ok2), 2}};
		r = stagehost_stream_submit_batch(s, c, 2);
	} else if (!strcmp(what, "zero dim")) {
		r = stagehost_stream_launch(s, st, (uint32_t[3]){1, 0, 1}, one, 0, ok2, 2);
	} else if (!strcmp(what, "block.z")) {
		r = stagehost_stream_launch(s, st, one, (uint32_t[3]){1, 1, 65}, 0, ok2, 2);
	} else if (!strcmp(what, "grid.y")) {
		r = stagehost_stream_launch(s, st, (uint32_t[3]){1, 65536, 1}, one, 0, ok2, 2);
	} else if (!strcmp(what, "threads")) {
		r = stagehost_stream_launch(s, st, one, (uint32_t[3]){512, 4, 1}, 0, ok2, 2);
	} else if (!strcmp(what, "shared")) {
		r = stagehost_stream_launch(s, st, one, one, (48 << 10) + 1, ok2, 2);
	} else if (!strcmp(what, "shape first")) {
		r = stagehost_stream_launch(s, st, one, (uint32_t[3]){2048, 1, 1}, 0, ok2, 1);
	} else if (!strcmp(what, "count")) {
		r = stagehost_stream_launch(s, st, one, one, 0, ok2, 1);
	} else if (!strcmp(what, "scalar for a buffer")) {
		stagehost_arg a[2] = {stagehost_u32(0), stagehost_u32(42)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "buffer for a scalar")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_whole(out)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "length")) {
		stagehost_arg a[2] = {stagehost_buf(out, 0, 3), stagehost_u32(42)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "u32 over")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_u64(1ull << 32)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "i32 over")) {
		stagehost_arg a[4] = {stagehost_u64(~0ull), stagehost_u64(1ull << 32), stagehost_f32(1.0f), stagehost_whole(out)};
		r = stagehost_stream_launch(s, sc, one, one, 0, a, 4);
	} else if (!strcmp(what, "scalars")) {
		/* a u64 of 64 bits; bytes of any length */
		stagehost_arg a[4] = {stagehost_u64(~0ull), stagehost_u32(0xffffffffu), stagehost_f32(-1.5f), stagehost_buf(out, 1, 3)};
		if ((r = stagehost_stream_launch(s, sc, one, one, 0, a, 4)) == STAGEHOST_OK) {
			r = stagehost_stream_sync(s);
		}
	} else if (!strcmp(what, "weights out")) {
		stagehost_arg a[2] = {stagehost_whole(w), stagehost_u32(42)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "weights inout")) {
		stagehost_arg a[2] = {stagehost_whole(w), stagehost_whole(w)};
		r = stagehost_stream_launch(s, cp, one, one, 0, a, 2);
	} else if (!strcmp(what, "weights past")) {
		stagehost_arg a[3] = {stagehost_whole(out), stagehost_u32(1), stagehost_whole(w)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 3);
	} else if (!strcmp(what, "weights for a scalar")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_whole(w)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "weights in")) {
		stagehost_arg a[2] = {stagehost_whole(w), stagehost_whole(out)};
		r = stagehost_stream_launch(s, cp, one, one, 0, a, 2);
		uint8_t v[4] = {0};
		if (r == STAGEHOST_OK && (r = stagehost_stream_read(s, out, 0, v, 4)) == STAGEHOST_OK && memcmp(v, "\x01\x02\x03\x04", 4) != 0) {
			r = STAGEHOST_CLOSED;
		}
	} else if (!strcmp(what, "stand-in fails")) {
		stagehost_arg a[1] = {stagehost_u32(1)};
		if ((r = stagehost_stream_launch(s, br, one, one, 0, a, 1)) == STAGEHOST_OK) {
			r = stagehost_stream_sync(s);
		}
	} else {
		r = STAGEHOST_CLOSED;
	}
	got = r;
	stagehost_last_error_str(got_err, sizeof got_err);
	return 0;
}

/* A declaration the emulator must refuse, naming part of why. */
static int refused(stagehost_emu *e, const char *name, const stagehost_emu_vendor_arg *args, uint32_t n, const char *want) {
	char why[256];
	if (stagehost_emu_vendor_kernel(e, name, args, n, store, why, sizeof why) || !strstr(why, want)) {
		fprintf(stderr, "declaring %s: want a refusal naming %s, got %s\n", name, want, why);
		return 1;
	}
	return 0;
}

int main(void) {
	int bad = 0;
	for (row = 0; row < (int)(sizeof rows / sizeof rows[0]); row++) {
		stagehost_emu *e = stagehost_emu_new();
		char why[256] = "";
		stagehost_emu_stream(e, "s0");
		stagehost_emu_buffer(e, "out", 4);
		stagehost_emu_program(e, "fill");
		if (!stagehost_emu_weights(e, "w", "\x01\x02\x03\x04", 4) || !stagehost_emu_vendor_kernel(e, "store", store_args, 2, store, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "copy", copy_args, 2, copy, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "scalars", scalar_args, 4, copy, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "broken", store_args + 1, 1, broken, why, sizeof why)) {
			fprintf(stderr, "declarations: %s\n", why);
			return 1;
		}
		got = STAGEHOST_CLOSED;
		got_err[0] = 0;
		stagehost_emu_result r = stagehost_emu_run(e, NULL, NULL, 0, stage);
		int fault_ok = rows[row].want == STAGEHOST_FAULT && r.outcome == STAGEHOST_EMU_FAULT;
		if ((r.outcome != STAGEHOST_EMU_OK && !fault_ok) || got != rows[row].want || (rows[row].lasterr && strcmp(got_err, rows[row].lasterr) != 0)) {
			fprintf(stderr, "%s: status %d, last error \"%s\" (outcome %d: %s); want %d \"%s\"\n", rows[row].what, got, got_err, r.outcome,
			        r.message ? r.message : "", rows[row].want, rows[row].lasterr ? rows[row].lasterr : "");
			bad = 1;
		}
		if (fault_ok && !strstr(got_err, "the stand-in refuses")) {
			fprintf(stderr, "stand-in fails: last error \"%s\" does not name the stand-in's reason\n", got_err);
			bad = 1;
		}
		stagehost_emu_free(e);
	}
	/* Declarations refused. */
	stagehost_emu *e = stagehost_emu_new();
	stagehost_emu_program(e, "fill");
	stagehost_emu_vendor_arg wide[STAGEHOST_MAX_ARGS + 1];
	for (int i = 0; i <= STAGEHOST_MAX_ARGS; i++) {
		wide[i] = (stagehost_emu_vendor_arg){"a", "u32", NULL, NULL};
	}
	bad |= refused(e, "", NULL, 0, "an empty name");
	bad |= refused(e, "fill", NULL, 0, "declared already");
	bad |= refused(e, "wide", wide, STAGEHOST_MAX_ARGS + 1, "17 arguments, more than a launch binds (16)");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "tensor", NULL, NULL}}, 1, "argument 0 (x): unknown kind \"tensor\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "buffer", "f64", "in"}}, 1, "argument 0 (x): unknown dtype \"f64\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "buffer", "f32", NULL}}, 1, "argument 0 (x): unknown direction \"\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"n", "u32", NULL, "in"}}, 1, "argument 0 (n): a u32 scalar has no dtype or dir");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{NULL, "u32", NULL, NULL}}, 1, "argument 0: an empty name");
	stagehost_emu_free(e);
	if (bad) {
		return 1;
	}
	puts("ok");
	return 0;
}
