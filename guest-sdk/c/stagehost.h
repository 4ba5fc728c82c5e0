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
 * naming the import; one that does not call it runs on every v1 host: a
 * module needs revision 2 only if it calls stagehost_last_error, and 3
 * only if it calls stagehost_weights_get or stagehost_tensor_get. */
#define STAGEHOST_ABI_REVISION 4
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
#define STAGEHOST_TENSOR_RECORD_SIZE 96 /* tensor_get's record (ABI.md §3) */
#define STAGEHOST_MAX_TENSOR_RANK 8

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

/* A tensor of safetensors weights, as tensor_get writes it (96 bytes,
 * revision 3). buffer is the weights' read-only buffer; the tensor's bytes
 * are [offset, offset+nbytes) of it. dtype: 0 f32, 1 f16, 2 bf16, 3 i32,
 * or a code from 16 for the other safetensors types (ABI.md §3). */
typedef struct stagehost_tensor_record {
	stagehost_handle buffer;
	uint64_t offset;
	uint64_t nbytes;
	uint32_t dtype;
	uint32_t rank; /* dims[0..rank) hold the shape; the rest are 0 */
	uint64_t dims[8];
} stagehost_tensor_record;

_Static_assert(sizeof(stagehost_arg) == STAGEHOST_ARG_RECORD_SIZE, "stagehost_arg must be 24 bytes");
_Static_assert(sizeof(stagehost_tensor_record) == STAGEHOST_TENSOR_RECORD_SIZE, "stagehost_tensor_record must be 96 bytes");
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

/* The device op library (docs/kernels.md). A stagehost_tensor is a typed,
 * row-major view of a buffer range; each stagehost_op_NAME helper fills
 * args (room for STAGEHOST_MAX_ARGS records) with one launch of the op
 * NAME and returns the argument count, 0 when the dims cannot be mapped.
 * Look the program up by the name stagehost_op_name writes ("softmax",
 * "gemm.bf16", "conv2d.fast"), then stagehost_stream_submit or a batch.
 * The host checks every launch against its op's contract at submit. */
#define STAGEHOST_DTYPE_F32 0u
#define STAGEHOST_DTYPE_F16 1u
#define STAGEHOST_DTYPE_BF16 2u
#define STAGEHOST_DTYPE_I32 3u

typedef struct stagehost_tensor {
	stagehost_handle buffer;
	uint32_t offset; /* byte offset of the first value */
	uint32_t dtype;  /* STAGEHOST_DTYPE_* */
	uint32_t ndims;  /* 0 to 4 (0: no tensor, e.g. conv2d without bias) */
	uint32_t dims[4];
} stagehost_tensor;

static inline uint32_t stagehost_dtype_size(uint32_t dtype) {
	return dtype == STAGEHOST_DTYPE_F16 || dtype == STAGEHOST_DTYPE_BF16 ? 2u : 4u;
}
static inline uint32_t stagehost_tensor_len(stagehost_tensor t) {
	uint32_t n = 1;
	for (uint32_t i = 0; i < t.ndims; i++) {
		n *= t.dims[i];
	}
	return t.ndims ? n : 0u;
}
static inline stagehost_arg stagehost_tensor_arg(stagehost_tensor t) {
	return stagehost_buf(t.buffer, t.offset, stagehost_tensor_len(t) * stagehost_dtype_size(t.dtype));
}

/* Writes the program name of op at dtype (fast: the .fast tier) into dst
 * (at least 32 bytes, NUL-terminated) and returns its length. */
static inline uint32_t stagehost_op_name(char *dst, const char *op, uint32_t dtype, int fast) {
	uint32_t n = 0;
	while (op[n] && n < 20) {
		dst[n] = op[n];
		n++;
	}
	const char *sfx = dtype == STAGEHOST_DTYPE_F16 ? ".f16" : dtype == STAGEHOST_DTYPE_BF16 ? ".bf16" : "";
	for (; *sfx; sfx++) {
		dst[n++] = *sfx;
	}
	if (fast) {
		for (sfx = ".fast"; *sfx; sfx++) {
			dst[n++] = *sfx;
		}
	}
	dst[n] = 0;
	return n;
}

/* Unary ops (exp log tanh sigmoid gelu_tanh gelu_erf silu rsqrt sqrt neg
 * abs): y may be x. */
static inline uint32_t stagehost_op_unary(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y) {
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	return 2;
}
#define stagehost_op_exp stagehost_op_unary
#define stagehost_op_log stagehost_op_unary
#define stagehost_op_tanh stagehost_op_unary
#define stagehost_op_sigmoid stagehost_op_unary
#define stagehost_op_gelu_tanh stagehost_op_unary
#define stagehost_op_gelu_erf stagehost_op_unary
#define stagehost_op_silu stagehost_op_unary
#define stagehost_op_rsqrt stagehost_op_unary
#define stagehost_op_sqrt stagehost_op_unary
#define stagehost_op_neg stagehost_op_unary
#define stagehost_op_abs stagehost_op_unary
static inline uint32_t stagehost_op_affine(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y, float a, float b) {
	stagehost_op_unary(args, x, y);
	args[2] = stagehost_f32(a);
	args[3] = stagehost_f32(b);
	return 4;
}

static inline int stagehost_dims4_(stagehost_tensor t, uint32_t d[4]) {
	if (t.ndims > 4) {
		return 0;
	}
	for (uint32_t i = 0; i < 4; i++) {
		d[i] = 1;
	}
	for (uint32_t i = 0; i < t.ndims; i++) {
		d[4 - t.ndims + i] = t.dims[i];
	}
	return 1;
}

/* Binary ops (add sub mul div max min), NumPy broadcasting: the dims of a
 * and b are right-aligned; c has the broadcast shape. */
static inline uint32_t stagehost_op_binary(stagehost_arg *args, stagehost_tensor a, stagehost_tensor b, stagehost_tensor c) {
	uint32_t da[4], db[4];
	if (!stagehost_dims4_(a, da) || !stagehost_dims4_(b, db)) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(a);
	args[1] = stagehost_tensor_arg(b);
	args[2] = stagehost_tensor_arg(c);
	for (uint32_t i = 0; i < 4; i++) {
		args[3 + i] = stagehost_u32(da[i]);
		args[7 + i] = stagehost_u32(db[i]);
	}
	return 11;
}

#define stagehost_op_add stagehost_op_binary
#define stagehost_op_sub stagehost_op_binary
#define stagehost_op_mul stagehost_op_binary
#define stagehost_op_div stagehost_op_binary
#define stagehost_op_max stagehost_op_binary
#define stagehost_op_min stagehost_op_binary

/* Reductions (reduce_sum reduce_mean reduce_max reduce_argmax) along
 * axis; reduce_argmax's y is i32. */
static inline uint32_t stagehost_op_reduce(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y, uint32_t axis) {
	if (axis >= x.ndims) {
		return 0;
	}
	uint32_t outer = 1, inner = 1;
	for (uint32_t i = 0; i < axis; i++) {
		outer *= x.dims[i];
	}
	for (uint32_t i = axis + 1; i < x.ndims; i++) {
		inner *= x.dims[i];
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	args[2] = stagehost_u32(outer);
	args[3] = stagehost_u32(x.dims[axis]);
	args[4] = stagehost_u32(inner);
	return 5;
}

static inline int stagehost_rows_cols_(stagehost_tensor x, uint32_t *rows, uint32_t *cols) {
	if (x.ndims == 0 || x.ndims > 4) {
		return 0;
	}
	*rows = 1;
	for (uint32_t i = 0; i + 1 < x.ndims; i++) {
		*rows *= x.dims[i];
	}
	*cols = x.dims[x.ndims - 1];
	return 1;
}

/* softmax and log_softmax along the last dim; causal 0 or Sq. */
static inline uint32_t stagehost_op_softmax(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y, uint32_t causal) {
	uint32_t rows, cols;
	if (!stagehost_rows_cols_(x, &rows, &cols)) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	args[2] = stagehost_u32(rows);
	args[3] = stagehost_u32(cols);
	args[4] = stagehost_u32(causal);
	return 5;
}
#define stagehost_op_reduce_sum stagehost_op_reduce
#define stagehost_op_reduce_mean stagehost_op_reduce
#define stagehost_op_reduce_max stagehost_op_reduce
#define stagehost_op_reduce_argmax stagehost_op_reduce
#define stagehost_op_log_softmax stagehost_op_softmax

static inline uint32_t stagehost_op_layernorm(stagehost_arg *args, stagehost_tensor x, stagehost_tensor gamma, stagehost_tensor beta, stagehost_tensor y, float eps) {
	uint32_t rows, cols;
	if (!stagehost_rows_cols_(x, &rows, &cols)) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(gamma);
	args[2] = stagehost_tensor_arg(beta);
	args[3] = stagehost_tensor_arg(y);
	args[4] = stagehost_u32(rows);
	args[5] = stagehost_u32(cols);
	args[6] = stagehost_f32(eps);
	return 7;
}

static inline uint32_t stagehost_op_rmsnorm(stagehost_arg *args, stagehost_tensor x, stagehost_tensor gamma, stagehost_tensor y, float eps) {
	uint32_t rows, cols;
	if (!stagehost_rows_cols_(x, &rows, &cols)) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(gamma);
	args[2] = stagehost_tensor_arg(y);
	args[3] = stagehost_u32(rows);
	args[4] = stagehost_u32(cols);
	args[5] = stagehost_f32(eps);
	return 6;
}

/* transpose: perm has x.ndims entries; y's dim i is x's dim perm[i]. */
static inline uint32_t stagehost_op_transpose(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y, const uint32_t *perm) {
	uint32_t d[4], p[4] = {0, 1, 2, 3}, k = 4 - x.ndims;
	if (!stagehost_dims4_(x, d)) {
		return 0;
	}
	for (uint32_t i = 0; i < x.ndims; i++) {
		p[k + i] = perm[i] + k;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	for (uint32_t i = 0; i < 4; i++) {
		args[2 + i] = stagehost_u32(d[i]);
		args[6 + i] = stagehost_u32(p[i]);
	}
	return 10;
}

/* gemm: a, b, c of 2 dims (one matrix) or 3 (a batch; a 2-dim a or b is
 * used for every matrix, stride 0). M and N from c, K from a. */
static inline uint32_t stagehost_op_gemm(stagehost_arg *args, stagehost_tensor a, stagehost_tensor b, stagehost_tensor c,
                                         int trans_a, int trans_b, float alpha, float beta) {
	if (a.ndims < 2 || a.ndims > 3 || b.ndims < 2 || b.ndims > 3 || c.ndims < 2 || c.ndims > 3) {
		return 0;
	}
	uint32_t ca = a.ndims - 2, cb = b.ndims - 2, cc = c.ndims - 2;
	uint32_t batch = cc ? c.dims[0] : 1;
	uint32_t k = trans_a ? a.dims[ca] : a.dims[ca + 1];
	args[0] = stagehost_tensor_arg(a);
	args[1] = stagehost_tensor_arg(b);
	args[2] = stagehost_tensor_arg(c);
	args[3] = stagehost_u32(c.dims[cc]);
	args[4] = stagehost_u32(c.dims[cc + 1]);
	args[5] = stagehost_u32(k);
	args[6] = stagehost_u32(trans_a ? 1u : 0u);
	args[7] = stagehost_u32(trans_b ? 1u : 0u);
	args[8] = stagehost_f32(alpha);
	args[9] = stagehost_f32(beta);
	args[10] = stagehost_u32(batch);
	args[11] = stagehost_u32(ca && batch > 1 ? a.dims[1] * a.dims[2] : 0u);
	args[12] = stagehost_u32(cb && batch > 1 ? b.dims[1] * b.dims[2] : 0u);
	args[13] = stagehost_u32(cc && batch > 1 ? c.dims[1] * c.dims[2] : 0u);
	return 14;
}

/* gather: table rows×cols f32, idx i32, out len(idx)×cols. */
static inline uint32_t stagehost_op_gather(stagehost_arg *args, stagehost_tensor table, stagehost_tensor idx, stagehost_tensor out) {
	if (table.ndims != 2) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(table);
	args[1] = stagehost_tensor_arg(idx);
	args[2] = stagehost_tensor_arg(out);
	args[3] = stagehost_u32(table.dims[0]);
	args[4] = stagehost_u32(table.dims[1]);
	return 5;
}

static inline uint64_t stagehost_pair(uint32_t h, uint32_t w) { return (uint64_t)h | (uint64_t)w << 32; }

/* conv2d (NCHW): x N×C×H×W, w K×(C/groups)×R×S, bias K values or ndims 0,
 * y N×K×P×Q; stride, pad, dil are {h, w}. */
static inline uint32_t stagehost_op_conv2d(stagehost_arg *args, stagehost_tensor x, stagehost_tensor w, stagehost_tensor bias, stagehost_tensor y,
                                           const uint32_t stride[2], const uint32_t pad[2], const uint32_t dil[2], uint32_t groups) {
	if (x.ndims != 4 || w.ndims != 4) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(w);
	args[2] = bias.ndims ? stagehost_tensor_arg(bias) : stagehost_buf(w.buffer, w.offset, 0);
	args[3] = stagehost_tensor_arg(y);
	for (uint32_t i = 0; i < 4; i++) {
		args[4 + i] = stagehost_u32(x.dims[i]);
	}
	args[8] = stagehost_u32(w.dims[0]);
	args[9] = stagehost_u32(w.dims[2]);
	args[10] = stagehost_u32(w.dims[3]);
	args[11] = stagehost_u64(stagehost_pair(stride[0], stride[1]));
	args[12] = stagehost_u64(stagehost_pair(pad[0], pad[1]));
	args[13] = stagehost_u64(stagehost_pair(dil[0], dil[1]));
	args[14] = stagehost_u32(groups);
	return 15;
}

/* maxpool2d and avgpool2d (NCHW): window, stride, pad are {h, w}. */
static inline uint32_t stagehost_op_pool2d(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y,
                                           const uint32_t window[2], const uint32_t stride[2], const uint32_t pad[2]) {
	if (x.ndims != 4) {
		return 0;
	}
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	for (uint32_t i = 0; i < 4; i++) {
		args[2 + i] = stagehost_u32(x.dims[i]);
	}
	args[6] = stagehost_u32(window[0]);
	args[7] = stagehost_u32(window[1]);
	args[8] = stagehost_u64(stagehost_pair(stride[0], stride[1]));
	args[9] = stagehost_u64(stagehost_pair(pad[0], pad[1]));
	return 10;
}
#define stagehost_op_maxpool2d stagehost_op_pool2d
#define stagehost_op_avgpool2d stagehost_op_pool2d

/* cast: y = x converted from x.dtype to y.dtype. */
static inline uint32_t stagehost_op_cast(stagehost_arg *args, stagehost_tensor x, stagehost_tensor y) {
	args[0] = stagehost_tensor_arg(x);
	args[1] = stagehost_tensor_arg(y);
	args[2] = stagehost_u32(x.dtype);
	args[3] = stagehost_u32(y.dtype);
	return 4;
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

/* The 32-bit address of args for a stagehost_command's args_ptr. On wasm32
 * it is the pointer; natively (a 64-bit pointer does not fit) the emulator,
 * emu.c, keeps args and resolves the token at the next
 * stagehost_stream_submit_batch, which forgets them. */
#if defined(__wasm__)
static inline uint32_t stagehost_args_ptr(const stagehost_arg *args) { return (uint32_t)(uintptr_t)args; }
#else
uint32_t stagehost_emu_args_ptr(const stagehost_arg *args, uint32_t count);
#define stagehost_args_ptr(args) stagehost_emu_args_ptr((args), STAGEHOST_MAX_ARGS)
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
/* Revision 3. The read-only buffer over the device copy of the weights
 * called name, which every session listing them shares: it can be read
 * (an op argument of direction "in", stream_read, buffer_size), never
 * written (stream_write, an "out" or "inout" op argument) or freed:
 * INVALID_ARGUMENT, with nothing enqueued. NOT_FOUND when the session
 * lists no such weights. */
STAGEHOST_IMPORT("weights_get") stagehost_status stagehost_weights_get(const char *name, uint32_t name_len, stagehost_handle *out_handle);
/* Revision 3. The tensor "<weights>/<tensor>" of safetensors weights. */
STAGEHOST_IMPORT("tensor_get") stagehost_status stagehost_tensor_get(const char *name, uint32_t name_len, stagehost_tensor_record *out);
/* Revision 4. One launch of a vendor kernel (a manifest's [[kernel]]):
 * grid and block are 3 uint32 each (x, y, z), shared_bytes its dynamic
 * shared memory. Checked against the device's launch limits and the
 * kernel's declared arguments before anything is enqueued
 * (INVALID_ARGUMENT, naming the dimension or argument). A vendor kernel
 * given to stream_submit is INVALID_ARGUMENT. */
STAGEHOST_IMPORT("stream_launch") stagehost_status stagehost_stream_launch(stagehost_handle stream, stagehost_handle program, const uint32_t *grid, const uint32_t *block, uint32_t shared_bytes, const stagehost_arg *args, uint32_t args_count);

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

/* The native emulator (guest-sdk/c/emu.c): compile a stage with emu.c and
 * a test to unit-test it without Wasm,
 *
 *   cc -Iinclude stage.c emu.c test.c -lm && ./a.out
 *
 * It implements every host function above with the host's statuses, last
 * error texts, handle layout, budget (a freed buffer stays charged until
 * the run's fence), deferred device work, built-in fence and quarantine,
 * as the Go and Rust emulators do, checked against the same shared cases
 * (guest-sdk/testdata/emucases.txt). Kernels: noop, fill, copy, saxpy,
 * relu, bias, matmul, argmax, mlp_forward, and the op library (checked at
 * submit against each op's contract, in the host's words): exp, log, tanh,
 * sigmoid, silu, gelu_tanh, gelu_erf, sqrt, rsqrt, neg, abs, affine, add,
 * sub, mul, div, max, min, reduce_sum, reduce_mean, reduce_max,
 * reduce_argmax, softmax, log_softmax, layernorm, rmsnorm, transpose,
 * gemm, gemm.fast, gather, conv2d, conv2d.fast, maxpool2d, avgpool2d and
 * cast, with .f16 and .bf16 storage where the op has it. The bounded ops
 * (exp, log, tanh, sigmoid, silu, gelu_*, softmax, log_softmax) compute
 * in double with libm and round once, as the simulator does: a value is
 * the simulator's or the storage type's next one (1 ulp; the gelu ops
 * are checked against the simulator's values, testdata/gelu_test.c). Weights
 * (revision 3): stagehost_emu_weights and stagehost_emu_safetensors list
 * them, and stagehost_weights_get, stagehost_tensor_get and every refused
 * write (stream_write into them, a launch whose kernel writes them or
 * does not describe the argument, buffer_free) give the host's statuses
 * and last errors. Vendor kernels (revision 4): stagehost_emu_vendor_kernel
 * declares one with its arguments and a native stand-in, and
 * stagehost_stream_launch checks each launch as the host does (see
 * there). A stage that crashes crashes the
 * test: traps are not emulated; neither are deadlines. One emulator runs
 * at a time per process. */
#if !defined(__wasm__)
typedef struct stagehost_emu stagehost_emu;

/* Outcomes of stagehost_emu_run (ABI.md §4.1). */
#define STAGEHOST_EMU_OK 0          /* the output is the result */
#define STAGEHOST_EMU_CLIENT 1      /* the stage returned code, message is its error_set text */
#define STAGEHOST_EMU_FAULT 2       /* device work of the run failed; message names it */
#define STAGEHOST_EMU_QUARANTINED 3 /* the fence failed: this and every later run */
#define STAGEHOST_EMU_BUSY 4        /* a run while one is running */

typedef struct stagehost_emu_result {
	int outcome;           /* STAGEHOST_EMU_* */
	int32_t code;          /* the stage's result (STAGEHOST_EMU_CLIENT) */
	const uint8_t *output; /* the output (valid until the next run) */
	uint32_t output_len;
	const char *message; /* NUL-terminated (valid until the next run) */
} stagehost_emu_result;

/* A session with no resources: budget 256 MiB (0: unlimited), output
 * limit 1 MiB, the built-in fence. */
stagehost_emu *stagehost_emu_new(void);
void stagehost_emu_free(stagehost_emu *e);
void stagehost_emu_budget(stagehost_emu *e, uint64_t bytes);
void stagehost_emu_output_limit(stagehost_emu *e, uint32_t bytes);
void stagehost_emu_stream(stagehost_emu *e, const char *name);
void stagehost_emu_buffer(stagehost_emu *e, const char *name, uint32_t size);
/* Lists raw weights called name holding a copy of data[0..len), as a
 * manifest's [[weights]] with format "raw": a read-only buffer that
 * stagehost_weights_get finds (not charged to the budget). Returns 0 on
 * an empty name, a name given twice, or no bytes. */
int stagehost_emu_weights(stagehost_emu *e, const char *name, const void *data, uint32_t len);
/* Lists weights called name from a safetensors file's bytes: the buffer
 * holds the file's data section, and stagehost_tensor_get finds each
 * tensor as "<name>/<tensor>". Returns 0, with the reason in why (cap
 * bytes; why may be NULL), for a header the strict reader refuses (as
 * the host's: a length above 100 MiB or beyond the file, JSON that is not
 * one object, an entry that is not exactly dtype, shape and data_offsets,
 * an unknown dtype, a rank above 8, a size that overflows or differs from
 * its range, offsets reversed, beyond the data or overlapping, a name
 * given twice, a __metadata__ that is not an object of strings), or for
 * stagehost_emu_weights's reasons. */
int stagehost_emu_safetensors(stagehost_emu *e, const char *name, const void *file, uint64_t len, char *why, uint32_t cap);
/* Allows the built-in kernel name; returns 0 when it is not emulated. */
int stagehost_emu_program(stagehost_emu *e, const char *name);
/* One declared argument of a vendor kernel, as a manifest's [[kernel]]
 * args give it: kind "buffer", "u32", "u64", "i32" or "f32"; a buffer's
 * dtype ("f32", "f16", "bf16", "i32" or "bytes"; NULL: bytes, the
 * manifest's default) and dir ("in", "out" or "inout"); a scalar has
 * neither (NULL). */
typedef struct stagehost_emu_vendor_arg {
	const char *name, *kind, *dtype, *dir;
} stagehost_emu_vendor_arg;
/* A launch argument as a vendor kernel's stand-in sees it: a buffer's
 * bytes (len bytes, a copy of its own, as the host gives a kernel on sim,
 * ABI.md §3.6: an "in" or "inout" range's bytes, an "out" range zeroed;
 * two arguments bound to the same buffer get two copies; when the kernel
 * returns 0, every "out" and "inout" copy is copied back into its buffer,
 * in argument order, an "in" copy never; when it fails, nothing is) or,
 * for a scalar (bytes NULL), its value. */
typedef struct stagehost_emu_arg {
	uint8_t *bytes;
	uint32_t len;
	uint64_t value;
} stagehost_emu_arg;
/* The native stand-in for a vendor kernel's PTX or Wasm module: returns
 * 0, or nonzero with its reason in why (cap bytes), which fails the
 * launch as a device fault (stagehost_stream_sync returns FAULT). */
typedef int (*stagehost_emu_kernel)(stagehost_emu_arg *args, uint32_t n, char *why, uint32_t cap);
/* Declares the vendor kernel name (a manifest's [[kernel]]) with its
 * nargs declared args, run by k; returns 1. Launched only with
 * stagehost_stream_launch (stream_submit and stream_submit_batch refuse
 * it: INVALID_ARGUMENT), which checks, in the host's order and words,
 * before enqueuing anything: the shape against the sim devices' fixed
 * limits (every dimension at least 1; block at most 1024 x 1024 x 64
 * and 1024 threads; grid at most 2^31-1 x 65535 x 65535; at most 49152
 * shared bytes; then ignored), the argument records (read-only weights
 * only where a buffer is declared "in"), and the arguments against args
 * (their count, each one's kind, a buffer's length a whole number of its
 * dtype's values, a u32, i32 or f32 value within 32 bits): each refusal
 * INVALID_ARGUMENT with the host's last error. Returns 0, with the
 * reason in why (cap bytes; why may be NULL), on what a manifest refuses
 * of a [[kernel]] (docs/manifest.md): a name that is not 1 to 64 of a-z,
 * 0-9, '_', '.' and '-', or that is a program a backend of the host has
 * built in ("fill", "softmax", "spin", ...: "\"fill\" is a built-in
 * program's name: ..."); more than STAGEHOST_MAX_ARGS args; an arg with
 * an empty name or a name given twice, an unknown kind, a buffer's
 * unknown dtype or dir, or a dtype or dir on a scalar. It returns 0 too
 * on no kernel or a program of that name declared already.
 * What differs from the host: the stand-in is native code, not a Wasm
 * instance or PTX; the shape is checked and then ignored; the
 * declaration is not checked against the kernel's code; and a failed
 * command's last error names the stream by the session's stream name
 * ("stream \"s0\": command 3: ...") where the host names its device
 * stream ("sim: sim:sim0/stream1: command 3: ..."); the command number is
 * the host's (every write, read and launch of the stream counts). */
int stagehost_emu_vendor_kernel(stagehost_emu *e, const char *name, const stagehost_emu_vendor_arg *args, uint32_t nargs, stagehost_emu_kernel k,
                                char *why, uint32_t cap);
/* The session's fence (a stagehost_fence): 0 or FAULT with every stream
 * idle proves the drain; anything else quarantines. NULL: built-in. */
void stagehost_emu_fence(stagehost_emu *e, int32_t (*fence)(void));
/* Runs stage as the host runs stagehost_run for entry (NULL: "main") with
 * input, then the fence and the idle check. */
stagehost_emu_result stagehost_emu_run(stagehost_emu *e, const char *entry, const void *input, uint32_t input_len,
                                       int32_t (*stage)(void));
/* Bytes charged to the budget now. */
uint64_t stagehost_emu_budget_used(const stagehost_emu *e);
#endif

#ifdef __cplusplus
}
#endif

#endif /* STAGEHOST_H */
