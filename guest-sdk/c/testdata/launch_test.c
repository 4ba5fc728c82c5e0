/*
 * Vendor kernels (stagehost_stream_launch, revision 4) on the C emulator,
 * emu.c: a declared kernel runs; a built-in program, a vendor kernel
 * given to stream_submit or a batch, a shape over the sim devices' fixed
 * limits, every argument that does not match the declaration, and
 * read-only weights where the kernel writes are refused with the host's
 * statuses and last errors; argument records are refused in the host's
 * words; a kernel gets copies of its buffers with the host's rules (in,
 * out zeroed, inout, nothing back after a failure, aliased arguments
 * apart); a failed command's number counts reads; declarations are
 * refused as a manifest refuses them, naming the reason. Prints "ok" and
 * exits 0 when every row agrees.
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

/* inw: writes its in buffer (the host drops the write). */
static int inw(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n, (void)why, (void)cap;
	a[0].bytes[0] = 99;
	return 0;
}

/* outz: fails unless its out buffer starts zeroed; then writes byte 1. */
static int outz(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n;
	for (uint32_t i = 0; i < a[0].len; i++) {
		if (a[0].bytes[i]) {
			snprintf(why, cap, "out byte %u is %u, not 0", i, a[0].bytes[i]);
			return 1;
		}
	}
	a[0].bytes[1] = 7;
	return 0;
}

/* inoutk: byte 0 += byte 1 of its inout buffer. */
static int inoutk(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n, (void)why, (void)cap;
	a[0].bytes[0] = (uint8_t)(a[0].bytes[0] + a[0].bytes[1]);
	return 0;
}

/* failw: writes its inout buffer, then fails. */
static int failw(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n;
	a[1].bytes[0] = 42;
	snprintf(why, cap, "the stand-in refuses");
	return 1;
}

/* alias: y[i] = x[i] + x[0] over bytes. */
static int alias(stagehost_emu_arg *a, uint32_t n, char *why, uint32_t cap) {
	(void)n, (void)why, (void)cap;
	for (uint32_t i = 0; i < a[1].len; i++) {
		a[1].bytes[i] = (uint8_t)(a[0].bytes[i] + a[0].bytes[0]);
	}
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
static const stagehost_emu_vendor_arg in_args[] = {{"x", "buffer", NULL, "in"}};
static const stagehost_emu_vendor_arg out_args[] = {{"y", "buffer", NULL, "out"}};
static const stagehost_emu_vendor_arg inout_args[] = {{"y", "buffer", NULL, "inout"}};
static const stagehost_emu_vendor_arg in_out_args[] = {{"x", "buffer", NULL, "in"}, {"y", "buffer", NULL, "out"}};
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
    {"i32 over", STAGEHOST_INVALID_ARGUMENT, "kernel \"scalars\": argument 1 (b): 0x100000000 does not fit an i32"},
    {"scalars", STAGEHOST_OK, NULL},
    {"weights out", STAGEHOST_INVALID_ARGUMENT,
     "store: argument 0 is the read-only weights \"w\", but the kernel's argument 0 is written (direction out)"},
    {"weights inout", STAGEHOST_INVALID_ARGUMENT,
     "copyk: argument 1 is the read-only weights \"w\", but the kernel's argument 1 is written (direction inout)"},
    {"weights past", STAGEHOST_INVALID_ARGUMENT,
     "store: argument 2 is the read-only weights \"w\", but the kernel's argument 2 is not described as read only"},
    {"weights for a scalar", STAGEHOST_INVALID_ARGUMENT, "kernel \"store\": argument 1 (v) is a u32 scalar, got a buffer"},
    {"weights in", STAGEHOST_OK, NULL},
    {"stand-in fails", STAGEHOST_FAULT, NULL},
    {"command number", STAGEHOST_FAULT, "stream \"s0\": command 3: kernel \"broken\": the stand-in refuses"},
    {"range", STAGEHOST_INVALID_ARGUMENT, "argument 0: range [0,+8) outside a buffer of 4 bytes"},
    {"to end past", STAGEHOST_INVALID_ARGUMENT, "argument 0: offset 8 beyond a buffer of 4 bytes"},
    {"reserved", STAGEHOST_INVALID_ARGUMENT, "argument 0: reserved field is not zero"},
    {"unknown kind", STAGEHOST_INVALID_ARGUMENT, "argument 0: unknown kind 2"},
    {"17 args", STAGEHOST_INVALID_ARGUMENT, "17 arguments, at most 16"},
    {"submit 17 args", STAGEHOST_INVALID_ARGUMENT, "17 arguments, at most 16"},
    {"batch 17 args", STAGEHOST_INVALID_ARGUMENT, "17 arguments, at most 16"},
    {"submit range", STAGEHOST_INVALID_ARGUMENT, "argument 0: range [2,+4) outside a buffer of 4 bytes"},
    {"submit range 1", STAGEHOST_INVALID_ARGUMENT, "argument 1: range [2,+4) outside a buffer of 4 bytes"},
    {"batch range", STAGEHOST_INVALID_ARGUMENT, "argument 0: range [2,+4) outside a buffer of 4 bytes"},
    {"write range", STAGEHOST_INVALID_ARGUMENT, "range [2,+4) outside a buffer of 4 bytes"},
    {"read range", STAGEHOST_INVALID_ARGUMENT, "range [4,+1) outside a buffer of 4 bytes"},
    {"in not copied back", STAGEHOST_OK, NULL},
    {"out starts zeroed", STAGEHOST_OK, NULL},
    {"inout", STAGEHOST_OK, NULL},
    {"failure copies nothing back", STAGEHOST_FAULT, NULL},
    {"aliased", STAGEHOST_OK, NULL},
};

/* Writes data[0..4) into b, launches k over b (twice when two), syncs
 * and reads b back into got; the status of the first that fails. */
static stagehost_status launch_b(stagehost_handle s, stagehost_handle k, stagehost_handle b, int two, const uint8_t *data, uint8_t *got) {
	uint32_t one[3] = {1, 1, 1};
	stagehost_arg a[2] = {stagehost_whole(b), stagehost_whole(b)};
	stagehost_status r = stagehost_stream_write(s, b, 0, data, 4);
	if (r == STAGEHOST_OK) {
		r = stagehost_stream_launch(s, k, one, one, 0, a, two ? 2 : 1);
	}
	stagehost_status sync = r == STAGEHOST_OK ? stagehost_stream_sync(s) : r;
	if (r == STAGEHOST_OK) {
		r = stagehost_stream_read(s, b, 0, got, 4);
	}
	return sync != STAGEHOST_OK ? sync : r;
}

static int row;
static char got_err[STAGEHOST_MAX_ERROR_MESSAGE + 1];
static stagehost_status got;

static int32_t stage(void) {
	stagehost_handle s, st, cp, sc, br, fill, out, w;
	if (stagehost_stream_get("s0", 2, &s) || stagehost_program_get("store", 5, &st) || stagehost_program_get("copyk", 5, &cp) ||
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
	} else if (!strcmp(what, "command number")) {
		/* write 1, read 2, launch 3: every command of the stream counts */
		uint8_t z[4] = {0};
		stagehost_arg a[1] = {stagehost_u32(1)};
		if ((r = stagehost_stream_write(s, out, 0, z, 4)) == STAGEHOST_OK && (r = stagehost_stream_read(s, out, 0, z, 4)) == STAGEHOST_OK &&
		    (r = stagehost_stream_launch(s, br, one, one, 0, a, 1)) == STAGEHOST_OK) {
			r = stagehost_stream_sync(s);
		}
	} else if (!strcmp(what, "range")) {
		stagehost_arg a[2] = {stagehost_buf(out, 0, 8), stagehost_u32(1)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "to end past")) {
		stagehost_arg a[2] = {stagehost_buf(out, 8, STAGEHOST_TO_END), stagehost_u32(1)};
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "reserved") || !strcmp(what, "unknown kind")) {
		stagehost_arg a[2] = {stagehost_whole(out), stagehost_u32(1)};
		if (!strcmp(what, "reserved")) {
			a[0].reserved = 1;
		} else {
			a[0].kind = 2;
		}
		r = stagehost_stream_launch(s, st, one, one, 0, a, 2);
	} else if (!strcmp(what, "17 args") || !strcmp(what, "submit 17 args") || !strcmp(what, "batch 17 args")) {
		stagehost_arg a[STAGEHOST_MAX_ARGS + 1];
		for (int i = 0; i <= STAGEHOST_MAX_ARGS; i++) {
			a[i] = stagehost_u32(0);
		}
		if (!strcmp(what, "17 args")) {
			r = stagehost_stream_launch(s, st, one, one, 0, a, STAGEHOST_MAX_ARGS + 1);
		} else if (!strcmp(what, "submit 17 args")) {
			r = stagehost_stream_submit(s, fill, a, STAGEHOST_MAX_ARGS + 1);
		} else {
			stagehost_command c[1] = {{fill, stagehost_args_ptr(a), STAGEHOST_MAX_ARGS + 1}};
			r = stagehost_stream_submit_batch(s, c, 1);
		}
	} else if (!strcmp(what, "submit range")) {
		stagehost_arg a[2] = {stagehost_buf(out, 2, 4), stagehost_f32(1.0f)};
		r = stagehost_stream_submit(s, fill, a, 2);
	} else if (!strcmp(what, "submit range 1")) {
		stagehost_arg a[2] = {stagehost_f32(1.0f), stagehost_buf(out, 2, 4)};
		r = stagehost_stream_submit(s, fill, a, 2);
	} else if (!strcmp(what, "batch range")) {
		stagehost_arg a[2] = {stagehost_buf(out, 2, 4), stagehost_f32(1.0f)};
		stagehost_command c[1] = {{fill, stagehost_args_ptr(a), 2}};
		r = stagehost_stream_submit_batch(s, c, 1);
	} else if (!strcmp(what, "write range") || !strcmp(what, "read range")) {
		uint8_t v[4] = {0};
		r = !strcmp(what, "write range") ? stagehost_stream_write(s, out, 2, v, 4) : stagehost_stream_read(s, out, 4, v, 1);
	} else if (!strcmp(what, "in not copied back") || !strcmp(what, "out starts zeroed") || !strcmp(what, "inout") ||
	           !strcmp(what, "failure copies nothing back") || !strcmp(what, "aliased")) {
		static const struct {
			const char *what, *kernel;
			int two;
			uint8_t before[4], after[4];
		} cs[] = {
		    {"in not copied back", "inw", 0, {1, 2, 3, 4}, {1, 2, 3, 4}},
		    {"out starts zeroed", "outz", 0, {5, 5, 5, 5}, {0, 7, 0, 0}},
		    {"inout", "inoutk", 0, {5, 6, 0, 0}, {11, 6, 0, 0}},
		    {"failure copies nothing back", "failw", 1, {3, 3, 3, 3}, {3, 3, 3, 3}},
		    {"aliased", "alias", 1, {1, 2, 3, 4}, {2, 3, 4, 5}}, /* x and y one buffer: y[i] = x[i] + x[0] */
		};
		size_t i = 0;
		while (strcmp(cs[i].what, what) != 0) {
			i++;
		}
		stagehost_handle k, b;
		uint8_t after[4] = {0};
		if (stagehost_program_get(cs[i].kernel, (uint32_t)strlen(cs[i].kernel), &k) || stagehost_buffer_get("b", 1, &b)) {
			return 1;
		}
		r = launch_b(s, k, b, cs[i].two, cs[i].before, after);
		if (r == STAGEHOST_FAULT) {
			stagehost_stream_read(s, b, 0, after, 4);
		}
		if (memcmp(after, cs[i].after, 4) != 0) {
			fprintf(stderr, "%s: b = %u %u %u %u, want %u %u %u %u\n", what, after[0], after[1], after[2], after[3], cs[i].after[0],
			        cs[i].after[1], cs[i].after[2], cs[i].after[3]);
			r = STAGEHOST_CLOSED;
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
		stagehost_emu_buffer(e, "b", 4);
		stagehost_emu_program(e, "fill");
		if (!stagehost_emu_weights(e, "w", "\x01\x02\x03\x04", 4) || !stagehost_emu_vendor_kernel(e, "store", store_args, 2, store, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "copyk", copy_args, 2, copy, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "inw", in_args, 1, inw, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "outz", out_args, 1, outz, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "inoutk", inout_args, 1, inoutk, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "failw", (stagehost_emu_vendor_arg[]){{"x", "buffer", NULL, "in"}, {"y", "buffer", NULL, "inout"}}, 2,
		                                 failw, why, sizeof why) ||
		    !stagehost_emu_vendor_kernel(e, "alias", in_out_args, 2, alias, why, sizeof why) ||
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
	char name64[65], name65[66];
	memset(name64, 'k', 64), name64[64] = 0;
	memset(name65, 'k', 65), name65[65] = 0;
	char why[256];
	if (!stagehost_emu_vendor_kernel(e, name64, store_args, 2, store, why, sizeof why) ||
	    !stagehost_emu_vendor_kernel(e, "a-z_0.9", wide, STAGEHOST_MAX_ARGS - 15, store, why, sizeof why)) {
		fprintf(stderr, "a manifest's kernel name refused: %s\n", why);
		bad = 1;
	}
	bad |= refused(e, "", NULL, 0, "\"\" is not a kernel name: 1 to 64 of a-z, 0-9, '_', '.' and '-'");
	bad |= refused(e, name65, NULL, 0, "is not a kernel name");
	bad |= refused(e, "Double", NULL, 0, "is not a kernel name");
	bad |= refused(e, "fill", NULL, 0, "\"fill\" is a built-in program's name: a vendor kernel needs a name of its own");
	bad |= refused(e, "softmax.bf16", NULL, 0, "is a built-in program's name");
	bad |= refused(e, "spin", NULL, 0, "is a built-in program's name");
	bad |= refused(e, "a-z_0.9", NULL, 0, "declared already");
	bad |= refused(e, "wide", wide, STAGEHOST_MAX_ARGS + 1, "17 arguments, more than a launch carries (16)");
	bad |= refused(e, "dup", wide, 2, "argument 1: the name \"a\" is given twice");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "tensor", NULL, NULL}}, 1, "argument 0 (x): unknown kind \"tensor\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "buffer", "f64", "in"}}, 1, "argument 0 (x): unknown dtype \"f64\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"x", "buffer", "f32", NULL}}, 1, "argument 0 (x): unknown direction \"\"");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{"n", "u32", NULL, "in"}}, 1, "argument 0 (n): only a buffer argument has a dtype or a direction (this one is a u32 scalar)");
	bad |= refused(e, "k", (stagehost_emu_vendor_arg[]){{NULL, "u32", NULL, NULL}}, 1, "argument 0: an empty name");
	stagehost_emu_free(e);
	if (bad) {
		return 1;
	}
	puts("ok");
	return 0;
}
