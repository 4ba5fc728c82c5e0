/*
 * stagehost.h: the stagehost guest ABI v1 for C (abi/ABI.md is normative).
 *
 * Freestanding: needs only <stdint.h>, which clang provides with -nostdlib.
 * Build a stage module with
 *
 *   clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -o stage.wasm stage.c
 *
 * (the export_name attributes below export the marker and your entry
 * points; wasm-ld exports memory by default). A stage:
 *
 *   #include "stagehost.h"
 *   STAGEHOST_ABI_V1();
 *   STAGEHOST_EXPORT("stagehost_run") int32_t run(void) { ... return 0; }
 *
 * Every function returns a status (STAGEHOST_OK or an error code) and
 * writes its out-parameters only on success. Pointers and lengths address
 * the module's own memory. Handles are opaque 64-bit values; 0 is never a
 * valid handle.
 */
#ifndef STAGEHOST_H
#define STAGEHOST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STAGEHOST_ABI_VERSION 1
/* The revision of v1 this header declares (ABI.md §1.4). A module that
 * calls a function of a later revision than the host's is refused at load,
 * naming the import; one that does not call it runs on every v1 host. */
#define STAGEHOST_ABI_REVISION 2
#define STAGEHOST_IMPORT_MODULE "stagehost_v1"

/* Status codes (ABI.md §5). Treat unknown non-zero codes as failures. */
#define STAGEHOST_OK 0
#define STAGEHOST_BUSY 1
#define STAGEHOST_DEVICE_LOST 2
#define STAGEHOST_UNSUPPORTED 3
#define STAGEHOST_INVALID_ARGUMENT 4
#define STAGEHOST_NOT_FOUND 5
#define STAGEHOST_OUT_OF_BUDGET 6
#define STAGEHOST_DEADLINE_EXCEEDED 7
#define STAGEHOST_REJECTED 8
#define STAGEHOST_FAULT 9
#define STAGEHOST_CLOSED 10
#define STAGEHOST_BAD_HANDLE 11
#define STAGEHOST_STALE_HANDLE 12
#define STAGEHOST_FOREIGN_HANDLE 13
#define STAGEHOST_OUT_OF_BOUNDS 14
#define STAGEHOST_OUTPUT_TOO_LARGE 15

/* Log levels. */
#define STAGEHOST_LOG_DEBUG 0
#define STAGEHOST_LOG_INFO 1
#define STAGEHOST_LOG_WARN 2
#define STAGEHOST_LOG_ERROR 3

/* Handle layout (ABI.md §2): kind in bits 63-56, session tag in 55-32,
 * serial in 31-0. */
#define STAGEHOST_KIND_STREAM 1
#define STAGEHOST_KIND_BUFFER 2
#define STAGEHOST_KIND_PROGRAM 3
#define STAGEHOST_HANDLE_KIND(h) ((uint32_t)((h) >> 56))

/* Limits and record layouts (ABI.md §3.1, §3.2). */
#define STAGEHOST_MAX_ARGS 16
#define STAGEHOST_MAX_BATCH 1024
#define STAGEHOST_MAX_ERROR_MESSAGE 4096
#define STAGEHOST_ARG_RECORD_SIZE 24
#define STAGEHOST_BATCH_RECORD_SIZE 16
#define STAGEHOST_ARG_SCALAR 0u
#define STAGEHOST_ARG_BUFFER 1u
#define STAGEHOST_TO_END 0xFFFFFFFFu /* argument length: to the end of the buffer */

typedef uint64_t stagehost_handle;
typedef int32_t stagehost_status;

/* One argument of a launch (24 bytes). */
typedef struct stagehost_arg {
	uint32_t kind;     /* STAGEHOST_ARG_SCALAR or STAGEHOST_ARG_BUFFER */
	uint32_t offset;   /* byte offset into the buffer (buffer kind) */
	uint32_t length;   /* byte length, or STAGEHOST_TO_END */
	uint32_t reserved; /* must be 0 */
	uint64_t value;    /* the scalar, or the buffer handle */
} stagehost_arg;

/* One launch of a batch (16 bytes). */
typedef struct stagehost_command {
	stagehost_handle program;
	uint32_t args_ptr;   /* address of args_count stagehost_arg records */
	uint32_t args_count; /* at most STAGEHOST_MAX_ARGS */
} stagehost_command;

_Static_assert(sizeof(stagehost_arg) == STAGEHOST_ARG_RECORD_SIZE, "stagehost_arg must be 24 bytes");
_Static_assert(sizeof(stagehost_command) == STAGEHOST_BATCH_RECORD_SIZE, "stagehost_command must be 16 bytes");

/* Argument constructors. */
static inline stagehost_arg stagehost_buf(stagehost_handle buffer, uint32_t offset, uint32_t length) {
	stagehost_arg a = {STAGEHOST_ARG_BUFFER, offset, length, 0, buffer};
	return a;
}
static inline stagehost_arg stagehost_whole(stagehost_handle buffer) {
	return stagehost_buf(buffer, 0, STAGEHOST_TO_END);
}
static inline stagehost_arg stagehost_u32(uint32_t v) {
	stagehost_arg a = {STAGEHOST_ARG_SCALAR, 0, 0, 0, v};
	return a;
}
static inline stagehost_arg stagehost_u64(uint64_t v) {
	stagehost_arg a = {STAGEHOST_ARG_SCALAR, 0, 0, 0, v};
	return a;
}
static inline stagehost_arg stagehost_f32(float v) {
	union { float f; uint32_t u; } bits = {v};
	return stagehost_u32(bits.u);
}

#if defined(__wasm__)
#define STAGEHOST_IMPORT(name) __attribute__((import_module("stagehost_v1"), import_name(name)))
#define STAGEHOST_EXPORT(name) __attribute__((export_name(name), visibility("default")))
#else
/* Native builds (unit tests of stage logic): the host functions are plain
 * extern functions that the test provides. */
#define STAGEHOST_IMPORT(name)
#define STAGEHOST_EXPORT(name)
#endif

/* Host functions (ABI.md §3), module "stagehost_v1". */
STAGEHOST_IMPORT("input_size") stagehost_status stagehost_input_size(uint32_t *out_len);
STAGEHOST_IMPORT("input_read") stagehost_status stagehost_input_read(uint32_t offset, void *dst, uint32_t dst_len, uint32_t *out_n);
STAGEHOST_IMPORT("output_write") stagehost_status stagehost_output_write(const void *src, uint32_t src_len);
STAGEHOST_IMPORT("entry_name") stagehost_status stagehost_entry_name(char *dst, uint32_t dst_cap, uint32_t *out_len);
STAGEHOST_IMPORT("error_set") stagehost_status stagehost_error_set(const char *msg, uint32_t msg_len);
/* Revision 2. The call's last error: the message of the last non-OK status
 * a host function returned during this call (a failed kernel's own reason
 * for stream_sync's FAULT), empty when there is none; at most
 * STAGEHOST_MAX_ERROR_MESSAGE bytes, not NUL-terminated. dst_cap too small:
 * OUT_OF_BOUNDS and only *out_len written, as entry_name. See also
 * stagehost_last_error_str. */
STAGEHOST_IMPORT("last_error") stagehost_status stagehost_last_error(char *dst, uint32_t dst_cap, uint32_t *out_len);
STAGEHOST_IMPORT("log") stagehost_status stagehost_log(int32_t level, const char *msg, uint32_t msg_len);
STAGEHOST_IMPORT("stream_get") stagehost_status stagehost_stream_get(const char *name, uint32_t name_len, stagehost_handle *out_handle);
STAGEHOST_IMPORT("buffer_get") stagehost_status stagehost_buffer_get(const char *name, uint32_t name_len, stagehost_handle *out_handle);
STAGEHOST_IMPORT("program_get") stagehost_status stagehost_program_get(const char *name, uint32_t name_len, stagehost_handle *out_handle);
STAGEHOST_IMPORT("buffer_alloc") stagehost_status stagehost_buffer_alloc(uint32_t size, stagehost_handle *out_handle);
/* Returns the live buffer allocated under name (1 to 256 bytes) if it has
 * size bytes, else allocates and names one: a new instance finds it again. */
STAGEHOST_IMPORT("buffer_alloc_named") stagehost_status stagehost_buffer_alloc_named(const char *name, uint32_t name_len, uint32_t size, stagehost_handle *out_handle);
STAGEHOST_IMPORT("buffer_free") stagehost_status stagehost_buffer_free(stagehost_handle buffer);
STAGEHOST_IMPORT("buffer_size") stagehost_status stagehost_buffer_size(stagehost_handle buffer, uint32_t *out_size);
STAGEHOST_IMPORT("stream_write") stagehost_status stagehost_stream_write(stagehost_handle stream, stagehost_handle buffer, uint32_t offset, const void *src, uint32_t src_len);
STAGEHOST_IMPORT("stream_read") stagehost_status stagehost_stream_read(stagehost_handle stream, stagehost_handle buffer, uint32_t offset, void *dst, uint32_t dst_len);
STAGEHOST_IMPORT("stream_submit") stagehost_status stagehost_stream_submit(stagehost_handle stream, stagehost_handle program, const stagehost_arg *args, uint32_t args_count);
STAGEHOST_IMPORT("stream_submit_batch") stagehost_status stagehost_stream_submit_batch(stagehost_handle stream, const stagehost_command *cmds, uint32_t cmds_count);
STAGEHOST_IMPORT("stream_sync") stagehost_status stagehost_stream_sync(stagehost_handle stream);
STAGEHOST_IMPORT("stream_idle") stagehost_status stagehost_stream_idle(stagehost_handle stream, uint32_t *out_idle);

/* Copies the call's last error into buf as a NUL-terminated string and
 * returns its length (0: there is none). A message that does not fit
 * buf_size (counting the NUL) leaves buf empty and returns the length it
 * needs; a buffer of STAGEHOST_MAX_ERROR_MESSAGE + 1 bytes always fits.
 * Call it right after the failed call it explains. Revision 2. */
static inline uint32_t stagehost_last_error_str(char *buf, uint32_t buf_size) {
	uint32_t n = 0;
	if (buf_size == 0) {
		return 0;
	}
	buf[0] = 0;
	if (stagehost_last_error(buf, buf_size - 1, &n) == STAGEHOST_OK) {
		buf[n] = 0;
	}
	return n;
}

/* The version marker export, () -> (). Use once per module, at file scope. */
#define STAGEHOST_ABI_V1() \
	STAGEHOST_EXPORT("stagehost_abi_v1") void stagehost_abi_v1(void) {} \
	_Static_assert(1, "")

/* Opts the module out of snapshots (ABI.md 4.3.1): every instance then
 * runs its own initialisation instead of starting from the state the host
 * captured once at load. Use at most once per module, at file scope. */
#define STAGEHOST_NO_SNAPSHOT() \
	STAGEHOST_EXPORT("stagehost_no_snapshot") void stagehost_no_snapshot(void) {} \
	_Static_assert(1, "")

/* Length of a NUL-terminated string, for names and messages. */
static inline uint32_t stagehost_strlen(const char *s) {
	uint32_t n = 0;
	while (s[n]) {
		n++;
	}
	return n;
}

/* memset, memcpy and memmove for freestanding wasm32 builds. clang calls
 * them for `float a[32] = {0};`, struct copies and loops it recognises,
 * even with -nostdlib, and without them wasm-ld fails with "undefined
 * symbol: memset". They are weak, so they may be in every file of a
 * module, and a libc's (wasi-libc's) strong ones win when one is linked.
 * With -mbulk-memory they are memory.fill and memory.copy; without it,
 * byte loops that clang may not turn back into calls (no_builtin). No flag
 * is needed: this header is enough. Define STAGEHOST_NO_MEM_FUNCTIONS
 * before including it to provide your own. */
#if defined(__wasm__) && !defined(STAGEHOST_NO_MEM_FUNCTIONS)
#define STAGEHOST_MEMFN_ __attribute__((weak, no_builtin))
STAGEHOST_MEMFN_ void *memset(void *dst, int c, __SIZE_TYPE__ n) {
#if defined(__wasm_bulk_memory__)
	__builtin_memset(dst, c, n);
#else
	unsigned char *d = (unsigned char *)dst;
	while (n--) {
		*d++ = (unsigned char)c;
	}
#endif
	return dst;
}
STAGEHOST_MEMFN_ void *memcpy(void *restrict dst, const void *restrict src, __SIZE_TYPE__ n) {
#if defined(__wasm_bulk_memory__)
	__builtin_memcpy(dst, src, n);
#else
	unsigned char *d = (unsigned char *)dst;
	const unsigned char *s = (const unsigned char *)src;
	while (n--) {
		*d++ = *s++;
	}
#endif
	return dst;
}
STAGEHOST_MEMFN_ void *memmove(void *dst, const void *src, __SIZE_TYPE__ n) {
#if defined(__wasm_bulk_memory__)
	__builtin_memmove(dst, src, n);
#else
	unsigned char *d = (unsigned char *)dst;
	const unsigned char *s = (const unsigned char *)src;
	if (d < s) {
		while (n--) {
			*d++ = *s++;
		}
	} else {
		d += n;
		s += n;
		while (n--) {
			*--d = *--s;
		}
	}
#endif
	return dst;
}
#undef STAGEHOST_MEMFN_
#endif

#ifdef __cplusplus
}
#endif

#endif /* STAGEHOST_H */
