/*
 * emu.c: a native emulator of the stagehost host for unit-testing C stages
 * (see the end of stagehost.h). Build: cc -I. stage.c emu.c test.c -lm.
 * Same semantics as the Go emulator (guest-sdk/emu) and the Rust one
 * (guest-sdk/rust/src/emu), checked against guest-sdk/testdata/emucases.txt.
 */
#include "stagehost.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_STREAM = 1, K_BUFFER = 2, K_PROGRAM = 3 };
#define QUEUE_DEPTH 1024
#define MAX_TAG ((1u << 24) - 1)

typedef struct karg {
	int is_buf;
	uint32_t buf; /* buffer index */
	uint32_t off, len;
	uint64_t value;
	uint8_t dtype; /* a buffer's values: 0 f32, 1 f16, 2 bf16, 3 i32, 4 bytes */
} karg;

/* A kernel reads and writes bufs[i] (len bytes each, copies of the ranges);
 * it returns NULL or writes its refusal into why. */
typedef int (*kernel_fn)(karg *a, uint32_t n, uint8_t **bufs, char *why, size_t cap);
typedef int (*check_fn)(const char *name, const karg *a, uint32_t n, char *why, size_t cap);

/* A vendor kernel (stagehost_emu_vendor_kernel): its stand-in and its
 * declared arguments (kind "buffer" or the scalar's type; a buffer's dtype
 * and dir; a scalar's dir "in"), the words static strings. */
typedef struct vdecl {
	stagehost_emu_kernel k;
	uint32_t n;
	struct {
		char *name; /* owned */
		const char *kind, *dtype, *dir;
	} a[STAGEHOST_MAX_ARGS];
} vdecl;

/* The longest vendor kernel name a manifest takes. */
#define MAX_KERNEL_NAME 64

typedef struct program {
	char name[MAX_KERNEL_NAME + 1];
	kernel_fn run;
	check_fn check;
	/* Per argument: T a buffer of the storage type, f f32, i i32, B bytes,
	 * - a scalar (NULL: every buffer f32). half: OP.f16 and OP.bf16 exist. */
	const char *btypes;
	int half;
	uint8_t dtype; /* the storage type: 0 f32, 1 f16, 2 bf16 */
	const struct vdecl *vendor; /* a vendor kernel's declaration; NULL: built in */
} program;

typedef struct object {
	uint8_t kind;
	uint64_t handle;
	char *name;
	uint32_t index; /* stream, buffer or program index */
} object;

typedef struct buffer {
	uint8_t *mem;
	uint32_t size;
	int allocated, freed;
	char *named;
	char *weights; /* the weights' name: a read-only buffer; NULL for any other */
} buffer;

/* Weights of the session (stagehost_emu_weights, stagehost_emu_safetensors). */
typedef struct wtensor {
	char *name;
	uint64_t begin, end;
	uint32_t code, rank;
	uint64_t dims[STAGEHOST_MAX_TENSOR_RANK];
} wtensor;

typedef struct weights {
	char *name;
	uint32_t obj; /* the object of the read-only buffer */
	wtensor *tensors;
	uint32_t ntensors;
} weights;

typedef struct command {
	uint64_t seq;
	int launch;
	uint32_t buf, off; /* write */
	uint8_t *data;
	uint32_t len;
	uint32_t prog; /* launch */
	karg args[STAGEHOST_MAX_ARGS];
	uint32_t nargs;
} command;

typedef struct stream {
	char *name;
	command *q;
	uint32_t head, count, cap;
	uint64_t seq;
	char **failures;
	uint32_t nfail;
} stream;

struct stagehost_emu {
	uint32_t tag, serial;
	object *objs;
	uint32_t nobjs;
	uint32_t *by_serial; /* serial -> object index + 1 */
	uint32_t nserial;
	stream *streams;
	uint32_t nstreams;
	buffer *bufs;
	uint32_t nbufs;
	program *progs;
	uint32_t nprogs;
	struct weights *weights;
	uint32_t nweights;
	uint64_t budget, used, freeing;
	uint32_t out_limit;
	int32_t (*fence)(void);
	int running;
	char *lost;
	char **failures;
	uint32_t nfail;
	const char *entry;
	const uint8_t *input;
	uint32_t input_len;
	uint8_t *output;
	uint32_t output_len;
	char err_msg[STAGEHOST_MAX_ERROR_MESSAGE + 1];
	char last_err[STAGEHOST_MAX_ERROR_MESSAGE + 1];
	char why[STAGEHOST_MAX_ERROR_MESSAGE + 1];
	char message[8192];
};

static stagehost_emu *cur;
static uint32_t last_tag;
static const stagehost_arg *batch_args[STAGEHOST_MAX_BATCH];
static uint32_t nbatch_args;

static void *xrealloc(void *p, size_t n) {
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		fprintf(stderr, "emu: out of memory\n");
		abort();
	}
	return q;
}

static char *xstrdup(const char *s) {
	size_t n = strlen(s);
	char *d = xrealloc(NULL, n + 1);
	memcpy(d, s, n + 1);
	return d;
}

static stagehost_emu *need(const char *op) {
	if (!cur) {
		fprintf(stderr, "stagehost: %s called outside an emulator run (natively, run stages with stagehost_emu_run)\n", op);
		abort();
	}
	return cur;
}

/* why: the detail of the failing call; st is returned. */
static stagehost_status fail(stagehost_emu *e, stagehost_status st, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->why, sizeof e->why, fmt, ap);
	va_end(ap);
	return st;
}

static const char *status_text(stagehost_status st) {
	switch (st) {
	case STAGEHOST_BAD_HANDLE: return "bad handle";
	case STAGEHOST_STALE_HANDLE: return "stale handle";
	case STAGEHOST_FOREIGN_HANDLE: return "handle of another session";
	case STAGEHOST_OUT_OF_BOUNDS: return "pointer or length outside guest memory";
	case STAGEHOST_OUTPUT_TOO_LARGE: return "output larger than its limit";
	case STAGEHOST_INVALID_ARGUMENT: return "invalid argument";
	case STAGEHOST_NOT_FOUND: return "not found";
	case STAGEHOST_OUT_OF_BUDGET: return "out of budget";
	case STAGEHOST_FAULT: return "device fault";
	}
	return "error";
}

/* note makes a non-OK st the run's last error. */
static stagehost_status note(stagehost_emu *e, stagehost_status st) {
	if (st != STAGEHOST_OK) {
		const char *m = e->why[0] ? e->why : status_text(st);
		size_t n = strlen(m);
		if (n > STAGEHOST_MAX_ERROR_MESSAGE) {
			n = STAGEHOST_MAX_ERROR_MESSAGE;
			while (n > 0 && ((unsigned char)m[n] & 0xC0) == 0x80) {
				n--;
			}
		}
		memmove(e->last_err, m, n);
		e->last_err[n] = 0;
	}
	e->why[0] = 0;
	return st;
}

/* Session setup. */

stagehost_emu *stagehost_emu_new(void) {
	stagehost_emu *e = xrealloc(NULL, sizeof *e);
	memset(e, 0, sizeof *e);
	do {
		last_tag = (last_tag + 1) & MAX_TAG;
	} while (last_tag == 0);
	e->tag = last_tag;
	e->budget = 256u << 20;
	e->out_limit = 1u << 20;
	return e;
}

void stagehost_emu_free(stagehost_emu *e) {
	if (!e) {
		return;
	}
	for (uint32_t i = 0; i < e->nobjs; i++) {
		free(e->objs[i].name);
	}
	for (uint32_t i = 0; i < e->nstreams; i++) {
		stream *s = &e->streams[i];
		for (uint32_t j = 0; j < s->count; j++) {
			free(s->q[(s->head + j) % s->cap].data);
		}
		for (uint32_t j = 0; j < s->nfail; j++) {
			free(s->failures[j]);
		}
		free(s->failures);
		free(s->q);
		free(s->name);
	}
	for (uint32_t i = 0; i < e->nbufs; i++) {
		free(e->bufs[i].mem);
		free(e->bufs[i].named);
		free(e->bufs[i].weights);
	}
	for (uint32_t i = 0; i < e->nweights; i++) {
		for (uint32_t j = 0; j < e->weights[i].ntensors; j++) {
			free(e->weights[i].tensors[j].name);
		}
		free(e->weights[i].tensors);
		free(e->weights[i].name);
	}
	free(e->weights);
	for (uint32_t i = 0; i < e->nfail; i++) {
		free(e->failures[i]);
	}
	free(e->failures);
	free(e->lost);
	free(e->objs);
	free(e->by_serial);
	free(e->streams);
	free(e->bufs);
	for (uint32_t i = 0; i < e->nprogs; i++) {
		const vdecl *d = e->progs[i].vendor;
		for (uint32_t j = 0; d && j < d->n; j++) {
			free(d->a[j].name);
		}
		free((void *)d);
	}
	free(e->progs);
	free(e->output);
	free(e);
}

void stagehost_emu_budget(stagehost_emu *e, uint64_t bytes) { e->budget = bytes; }
void stagehost_emu_output_limit(stagehost_emu *e, uint32_t bytes) { e->out_limit = bytes; }
void stagehost_emu_fence(stagehost_emu *e, int32_t (*fence)(void)) { e->fence = fence; }
uint64_t stagehost_emu_budget_used(const stagehost_emu *e) { return e->used; }

static uint32_t add_object(stagehost_emu *e, uint8_t kind, const char *name, uint32_t index) {
	for (uint32_t i = 0; name && i < e->nobjs; i++) {
		if (e->objs[i].kind == kind && e->objs[i].name && strcmp(e->objs[i].name, name) == 0) {
			fprintf(stderr, "emu: %s \"%s\" declared twice\n", kind == K_STREAM ? "stream" : kind == K_BUFFER ? "buffer" : "program", name);
			abort();
		}
	}
	e->objs = xrealloc(e->objs, (e->nobjs + 1) * sizeof *e->objs);
	e->objs[e->nobjs] = (object){kind, 0, name ? xstrdup(name) : NULL, index};
	return e->nobjs++;
}

void stagehost_emu_stream(stagehost_emu *e, const char *name) {
	e->streams = xrealloc(e->streams, (e->nstreams + 1) * sizeof *e->streams);
	memset(&e->streams[e->nstreams], 0, sizeof(stream));
	e->streams[e->nstreams].name = xstrdup(name);
	add_object(e, K_STREAM, name, e->nstreams++);
}

static uint32_t add_buffer(stagehost_emu *e, uint32_t size, int allocated) {
	e->bufs = xrealloc(e->bufs, (e->nbufs + 1) * sizeof *e->bufs);
	buffer *b = &e->bufs[e->nbufs];
	memset(b, 0, sizeof *b);
	b->mem = xrealloc(NULL, size);
	memset(b->mem, 0, size);
	b->size = size;
	b->allocated = allocated;
	return e->nbufs++;
}

void stagehost_emu_buffer(stagehost_emu *e, const char *name, uint32_t size) {
	add_object(e, K_BUFFER, name, add_buffer(e, size, 0));
}

/* Weights (ABI revision 3): read-only buffers over the session's
 * [[weights]], raw or from a safetensors file whose header a strict
 * reader checks (guest-sdk/internal/safetensors, written again). */


static int add_weights(stagehost_emu *e, const char *name, const uint8_t *data, uint64_t len, wtensor *ts, uint32_t nts, char *why,
                       size_t cap) {
	for (uint32_t i = 0; i < e->nweights; i++) {
		if (strcmp(e->weights[i].name, name) == 0) {
			len = 0;
		}
	}
	if (!name[0] || len == 0 || len > UINT32_MAX) {
		if (why) {
			snprintf(why, cap, "emu: weights \"%s\": an empty name, given twice, or no bytes (or above 4 GiB)", name);
		}
		for (uint32_t i = 0; i < nts; i++) {
			free(ts[i].name);
		}
		free(ts);
		return 0;
	}
	uint32_t b = add_buffer(e, (uint32_t)len, 0);
	memcpy(e->bufs[b].mem, data, len);
	e->bufs[b].weights = xstrdup(name);
	e->weights = xrealloc(e->weights, (e->nweights + 1) * sizeof *e->weights);
	e->weights[e->nweights++] = (weights){xstrdup(name), add_object(e, K_BUFFER, NULL, b), ts, nts};
	return 1;
}

int stagehost_emu_weights(stagehost_emu *e, const char *name, const void *data, uint32_t len) {
	return add_weights(e, name, data, len, NULL, 0, NULL, 0);
}

/* The strict JSON reader of a safetensors header. */
typedef struct jp {
	const uint8_t *s;
	size_t i, n;
	char *why;
	size_t cap;
} jp;

static int jfail(jp *p, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->why, p->cap, fmt, ap);
	va_end(ap);
	return 0;
}
#define JFAIL jfail

static void jws(jp *p) {
	while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) {
		p->i++;
	}
}
static int jeat(jp *p, char c) {
	jws(p);
	if (p->i < p->n && p->s[p->i] == (uint8_t)c) {
		p->i++;
		return 1;
	}
	return 0;
}
static int jhex4(jp *p, uint32_t *v) {
	*v = 0;
	if (p->i + 4 > p->n) {
		return 0;
	}
	for (int k = 0; k < 4; k++) {
		uint8_t c = p->s[p->i++];
		uint32_t d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 99;
		if (d == 99) {
			return 0;
		}
		*v = *v << 4 | d;
	}
	return 1;
}
static void jput(char **out, size_t *len, uint32_t c) {
	uint8_t b[4];
	size_t n = 0;
	if (c < 0x80) {
		b[n++] = (uint8_t)c;
	} else if (c < 0x800) {
		b[n++] = 0xC0 | c >> 6, b[n++] = 0x80 | (c & 0x3F);
	} else if (c < 0x10000) {
		b[n++] = 0xE0 | c >> 12, b[n++] = 0x80 | (c >> 6 & 0x3F), b[n++] = 0x80 | (c & 0x3F);
	} else {
		b[n++] = 0xF0 | c >> 18, b[n++] = 0x80 | (c >> 12 & 0x3F), b[n++] = 0x80 | (c >> 6 & 0x3F), b[n++] = 0x80 | (c & 0x3F);
	}
	*out = xrealloc(*out, *len + n + 1);
	memcpy(*out + *len, b, n);
	*len += n;
	(*out)[*len] = 0;
}
/* jstring reads a string into a new NUL-terminated *out (escapes decoded). */
static int jstring(jp *p, char **out) {
	size_t len = 0;
	*out = xrealloc(NULL, 1);
	(*out)[0] = 0;
	if (!jeat(p, '"')) {
		return JFAIL(p, "safetensors: bad JSON: want a string at byte %zu", p->i);
	}
	for (;;) {
		if (p->i >= p->n) {
			return JFAIL(p, "safetensors: bad JSON: an unterminated string");
		}
		uint8_t c = p->s[p->i++];
		if (c == '"') {
			return 1;
		}
		if (c < 0x20) {
			return JFAIL(p, "safetensors: bad JSON: a control character in a string");
		}
		if (c != '\\') {
			jput(out, &len, c);
			if (c >= 0x80) { /* raw UTF-8 bytes are kept as they are */
				(*out)[len - 2] = (char)c, len--, (*out)[len] = 0;
			}
			continue;
		}
		if (p->i >= p->n) {
			return JFAIL(p, "safetensors: bad JSON: an unterminated string");
		}
		uint32_t u;
		switch (p->s[p->i++]) {
		case '"': u = '"'; break;
		case '\\': u = '\\'; break;
		case '/': u = '/'; break;
		case 'b': u = 8; break;
		case 'f': u = 12; break;
		case 'n': u = 10; break;
		case 'r': u = 13; break;
		case 't': u = 9; break;
		case 'u':
			if (!jhex4(p, &u)) {
				return JFAIL(p, "safetensors: bad JSON: a bad \\u escape");
			}
			if (u >= 0xD800 && u < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
				size_t save = p->i;
				uint32_t lo;
				p->i += 2;
				if (jhex4(p, &lo) && lo >= 0xDC00 && lo < 0xE000) {
					u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
				} else {
					p->i = save;
				}
			}
			if (u >= 0xD800 && u < 0xE000) {
				u = 0xFFFD;
			}
			break;
		default: return JFAIL(p, "safetensors: bad JSON: a bad escape");
		}
		jput(out, &len, u);
	}
}
static int juint(jp *p, uint64_t *v) {
	jws(p);
	size_t start = p->i;
	*v = 0;
	while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
		uint64_t d = p->s[p->i] - '0';
		if (*v > (UINT64_MAX - d) / 10) {
			return JFAIL(p, "safetensors: the number at byte %zu overflows 64 bits", start);
		}
		*v = *v * 10 + d;
		p->i++;
	}
	if (p->i == start || (p->i - start > 1 && p->s[start] == '0') ||
	    (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))) {
		return JFAIL(p, "safetensors: want a non-negative integer at byte %zu", start);
	}
	return 1;
}
/* juints reads an array of at most max numbers; *n gets the count (max+1
 * when there are more). */
static int juints(jp *p, uint64_t *v, uint32_t max, uint32_t *n) {
	*n = 0;
	if (!jeat(p, '[')) {
		return JFAIL(p, "safetensors: bad JSON: want an array at byte %zu", p->i);
	}
	if (jeat(p, ']')) {
		return 1;
	}
	for (;;) {
		uint64_t x;
		if (!juint(p, &x)) {
			return 0;
		}
		if (*n < max) {
			v[*n] = x;
		}
		if (*n <= max) {
			(*n)++;
		}
		if (jeat(p, ',')) {
			continue;
		}
		if (!jeat(p, ']')) {
			return JFAIL(p, "safetensors: bad JSON: want ] at byte %zu", p->i);
		}
		return 1;
	}
}

static const struct {
	const char *name;
	uint32_t code, size;
} st_dtypes[] = {{"F32", 0, 4},  {"F16", 1, 2},   {"BF16", 2, 2}, {"I32", 3, 4},     {"F64", 16, 8},     {"I64", 17, 8},
                 {"I16", 18, 2}, {"I8", 19, 1},   {"U8", 20, 1},  {"BOOL", 21, 1},   {"U16", 22, 2},     {"U32", 23, 4},
                 {"U64", 24, 8}, {"F8_E4M3", 25, 1}, {"F8_E5M2", 26, 1}};

static int jtensor(jp *p, const char *name, uint64_t data_size, wtensor *t) {
	char *dt = NULL;
	int have_dt = 0, have_shape = 0, have_offs = 0, ok = 0;
	uint64_t offs[3];
	uint32_t noffs = 0;
	memset(t, 0, sizeof *t);
	if (!jeat(p, '{')) {
		return JFAIL(p, "safetensors: tensor \"%s\": want an object of dtype, shape and data_offsets", name);
	}
	if (!jeat(p, '}')) {
		for (;;) {
			char *key;
			jws(p);
			if (!jstring(p, &key)) {
				free(key);
				goto out;
			}
			if (!jeat(p, ':')) {
				free(key);
				JFAIL(p, "safetensors: tensor \"%s\": bad JSON: want : at byte %zu", name, p->i);
				goto out;
			}
			int dup = 0, r;
			if (strcmp(key, "dtype") == 0) {
				dup = have_dt++;
				free(dt);
				jws(p);
				r = jstring(p, &dt);
			} else if (strcmp(key, "shape") == 0) {
				dup = have_shape++;
				r = juints(p, t->dims, STAGEHOST_MAX_TENSOR_RANK, &t->rank);
			} else if (strcmp(key, "data_offsets") == 0) {
				dup = have_offs++;
				r = juints(p, offs, 3, &noffs);
			} else {
				JFAIL(p, "safetensors: tensor \"%s\": want an object of dtype, shape and data_offsets: unknown field \"%s\"", name, key);
				free(key);
				goto out;
			}
			if (r && dup) {
				JFAIL(p, "safetensors: tensor \"%s\": \"%s\" given twice", name, key);
			}
			free(key);
			if (!r || dup) {
				goto out;
			}
			if (jeat(p, ',')) {
				continue;
			}
			if (!jeat(p, '}')) {
				JFAIL(p, "safetensors: tensor \"%s\": bad JSON: want } at byte %zu", name, p->i);
				goto out;
			}
			break;
		}
	}
	if (!have_dt || !have_shape || !have_offs) {
		JFAIL(p, "safetensors: tensor \"%s\": want dtype, shape and data_offsets", name);
		goto out;
	}
	if (!name[0]) {
		JFAIL(p, "safetensors: tensor name \"\": want a non-empty UTF-8 name");
		goto out;
	}
	size_t k = 0;
	while (k < sizeof st_dtypes / sizeof st_dtypes[0] && strcmp(st_dtypes[k].name, dt) != 0) {
		k++;
	}
	if (k == sizeof st_dtypes / sizeof st_dtypes[0]) {
		JFAIL(p, "safetensors: tensor \"%s\": unknown dtype \"%s\"", name, dt);
		goto out;
	}
	if (t->rank > STAGEHOST_MAX_TENSOR_RANK) {
		JFAIL(p, "safetensors: tensor \"%s\": rank above %d", name, STAGEHOST_MAX_TENSOR_RANK);
		goto out;
	}
	uint64_t nb = st_dtypes[k].size;
	for (uint32_t i = 0; i < t->rank; i++) {
		if (t->dims[i] && nb > UINT64_MAX / t->dims[i]) {
			JFAIL(p, "safetensors: tensor \"%s\": the shape of %s overflows", name, dt);
			goto out;
		}
		nb *= t->dims[i];
	}
	if (noffs != 2) {
		JFAIL(p, "safetensors: tensor \"%s\": data_offsets must be [begin, end], got %u values", name, noffs);
		goto out;
	}
	if (offs[0] > offs[1]) {
		JFAIL(p, "safetensors: tensor \"%s\": data_offsets [%llu, %llu] are reversed", name, (unsigned long long)offs[0],
		      (unsigned long long)offs[1]);
		goto out;
	}
	if (offs[1] > data_size) {
		JFAIL(p, "safetensors: tensor \"%s\": data_offsets [%llu, %llu] end beyond the data section's %llu bytes", name,
		      (unsigned long long)offs[0], (unsigned long long)offs[1], (unsigned long long)data_size);
		goto out;
	}
	if (offs[1] - offs[0] != nb) {
		JFAIL(p, "safetensors: tensor \"%s\": the shape of %s needs %llu bytes, data_offsets [%llu, %llu] hold %llu", name, dt,
		      (unsigned long long)nb, (unsigned long long)offs[0], (unsigned long long)offs[1], (unsigned long long)(offs[1] - offs[0]));
		goto out;
	}
	t->name = xstrdup(name);
	t->code = st_dtypes[k].code;
	t->begin = offs[0], t->end = offs[1];
	ok = 1;
out:
	free(dt);
	return ok;
}

static int jmetadata(jp *p) {
	jws(p);
	if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
		p->i += 4;
		return 1;
	}
	if (!jeat(p, '{')) {
		return JFAIL(p, "safetensors: __metadata__ must be an object of strings");
	}
	if (jeat(p, '}')) {
		return 1;
	}
	for (;;) {
		char *k = NULL, *v = NULL;
		jws(p);
		int r = jstring(p, &k) && jeat(p, ':') && (jws(p), jstring(p, &v));
		free(k);
		free(v);
		if (!r) {
			return JFAIL(p, "safetensors: __metadata__ must be an object of strings");
		}
		if (jeat(p, ',')) {
			continue;
		}
		if (!jeat(p, '}')) {
			return JFAIL(p, "safetensors: __metadata__ must be an object of strings");
		}
		return 1;
	}
}

static int cmp_tensor(const void *a, const void *b) {
	const wtensor *x = a, *y = b;
	if (x->begin != y->begin) {
		return x->begin < y->begin ? -1 : 1;
	}
	return x->end < y->end ? -1 : x->end > y->end;
}

int stagehost_emu_safetensors(stagehost_emu *e, const char *name, const void *file, uint64_t len, char *why, uint32_t cap) {
	char dummy[512];
	if (!why) {
		why = dummy, cap = sizeof dummy;
	}
	const uint8_t *f = file;
	if (len < 8) {
		snprintf(why, cap, "safetensors: a file of %llu bytes is too short for a safetensors header (8 bytes of length first)",
		         (unsigned long long)len);
		return 0;
	}
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--) {
		n = n << 8 | f[i];
	}
	if (n > (100u << 20)) {
		snprintf(why, cap, "safetensors: header length %llu is above the limit of %u bytes", (unsigned long long)n, 100u << 20);
		return 0;
	}
	if (n > len - 8) {
		snprintf(why, cap, "safetensors: header length %llu is beyond the file's %llu bytes", (unsigned long long)n, (unsigned long long)len);
		return 0;
	}
	uint64_t data_size = len - 8 - n;
	jp p = {f + 8, 0, (size_t)n, why, cap};
	wtensor *ts = NULL;
	uint32_t nts = 0;
	char **seen = NULL;
	uint32_t nseen = 0;
	int ok = 0;
	if (!jeat(&p, '{')) {
		JFAIL(&p, "safetensors: the header is not a JSON object");
		goto out;
	}
	if (!jeat(&p, '}')) {
		for (;;) {
			char *key;
			jws(&p);
			if (!jstring(&p, &key)) {
				free(key);
				goto out;
			}
			for (uint32_t i = 0; i < nseen; i++) {
				if (strcmp(seen[i], key) == 0) {
					JFAIL(&p, "safetensors: \"%s\" is given twice", key);
					free(key);
					goto out;
				}
			}
			seen = xrealloc(seen, (nseen + 1) * sizeof *seen);
			seen[nseen++] = key;
			if (!jeat(&p, ':')) {
				JFAIL(&p, "safetensors: bad JSON: want : at byte %zu", p.i);
				goto out;
			}
			if (strcmp(key, "__metadata__") == 0) {
				if (!jmetadata(&p)) {
					goto out;
				}
			} else {
				ts = xrealloc(ts, (nts + 1) * sizeof *ts);
				if (!jtensor(&p, key, data_size, &ts[nts])) {
					goto out;
				}
				nts++;
			}
			if (jeat(&p, ',')) {
				continue;
			}
			if (!jeat(&p, '}')) {
				JFAIL(&p, "safetensors: bad JSON: want } at byte %zu", p.i);
				goto out;
			}
			break;
		}
	}
	jws(&p);
	if (p.i != p.n) {
		JFAIL(&p, "safetensors: bad JSON: data after the header's object");
		goto out;
	}
	if (nts) {
		qsort(ts, nts, sizeof *ts, cmp_tensor);
	}
	/* Sorted by begin, a non-empty tensor overlaps an earlier one exactly
	 * when it begins before the furthest end of the non-empty ones before it. */
	int64_t last = -1;
	for (uint32_t i = 0; i < nts; i++) {
		if (ts[i].begin == ts[i].end) {
			continue;
		}
		if (last >= 0 && ts[i].begin < ts[last].end) {
			JFAIL(&p, "safetensors: tensor \"%s\" [%llu,%llu) overlaps tensor \"%s\" [%llu,%llu)", ts[i].name, (unsigned long long)ts[i].begin,
			      (unsigned long long)ts[i].end, ts[last].name, (unsigned long long)ts[last].begin, (unsigned long long)ts[last].end);
			goto out;
		}
		if (last < 0 || ts[i].end > ts[last].end) {
			last = i;
		}
	}
	ok = 1;
out:
	for (uint32_t i = 0; i < nseen; i++) {
		free(seen[i]);
	}
	free(seen);
	if (!ok) {
		for (uint32_t i = 0; i < nts; i++) {
			free(ts[i].name);
		}
		free(ts);
		return 0;
	}
	return add_weights(e, name, f + 8 + n, data_size, ts, nts, why, cap);
}

/* Kernels. */

static float getf(const uint8_t *b, uint32_t i) {
	float f;
	memcpy(&f, b + 4 * i, 4);
	return f;
}
static void putf(uint8_t *b, uint32_t i, float f) { memcpy(b + 4 * i, &f, 4); }

#define REFUSE(...) (snprintf(why, cap, __VA_ARGS__), 1)

static int want_args(const char *k, uint32_t n, uint32_t w, char *why, size_t cap) {
	if (n != w) {
		return REFUSE("kernel \"%s\" takes %u arguments, got %u", k, w, n);
	}
	return 0;
}

static int floats_arg(const char *k, const karg *a, uint32_t i, char *why, size_t cap) {
	if (!a[i].is_buf) {
		return REFUSE("kernel \"%s\": argument %u is a scalar, not a buffer", k, i);
	}
	if (a[i].len % 4) {
		return REFUSE("kernel \"%s\": argument %u: %u bytes is not a whole number of float32", k, i, a[i].len);
	}
	if (a[i].len && a[i].off % 4) {
		return REFUSE("kernel \"%s\": argument %u: offset %u is not 4-byte aligned", k, i, a[i].off);
	}
	return 0;
}

static int scalar_arg(const char *k, const karg *a, uint32_t i, char *why, size_t cap) {
	if (a[i].is_buf) {
		return REFUSE("kernel \"%s\": argument %u is a buffer, not a scalar", k, i);
	}
	return 0;
}

static float scalar_f32(const karg *a) {
	uint32_t u = (uint32_t)a->value;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static int k_noop(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)a, (void)n, (void)b, (void)why, (void)cap;
	return 0;
}

static int k_fill(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("fill", n, 2, why, cap) || floats_arg("fill", a, 0, why, cap) || scalar_arg("fill", a, 1, why, cap)) {
		return 1;
	}
	float v = scalar_f32(&a[1]);
	for (uint32_t i = 0; i < a[0].len / 4; i++) {
		putf(b[0], i, v);
	}
	return 0;
}

static int k_copy(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("copy", n, 2, why, cap)) {
		return 1;
	}
	for (uint32_t i = 0; i < 2; i++) {
		if (!a[i].is_buf) {
			return REFUSE("kernel \"copy\": argument %u is a scalar, not a buffer", i);
		}
	}
	if (a[0].len != a[1].len) {
		return REFUSE("copy: dst has %u bytes, src %u", a[0].len, a[1].len);
	}
	memcpy(b[0], b[1], a[0].len);
	return 0;
}

static int k_saxpy(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("saxpy", n, 3, why, cap) || scalar_arg("saxpy", a, 0, why, cap) || floats_arg("saxpy", a, 1, why, cap) ||
	    floats_arg("saxpy", a, 2, why, cap)) {
		return 1;
	}
	if (a[1].len != a[2].len) {
		return REFUSE("saxpy: x has %u values, y %u", a[1].len / 4, a[2].len / 4);
	}
	float k = scalar_f32(&a[0]);
	for (uint32_t i = 0; i < a[2].len / 4; i++) {
		volatile float p = k * getf(b[1], i); /* rounded before the add: never fused */
		putf(b[2], i, p + getf(b[2], i));
	}
	return 0;
}

static int k_relu(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("relu", n, 1, why, cap) || floats_arg("relu", a, 0, why, cap)) {
		return 1;
	}
	for (uint32_t i = 0; i < a[0].len / 4; i++) {
		if (getf(b[0], i) < 0) {
			putf(b[0], i, 0);
		}
	}
	return 0;
}

static int k_bias(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("bias", n, 4, why, cap) || scalar_arg("bias", a, 2, why, cap) || scalar_arg("bias", a, 3, why, cap) ||
	    floats_arg("bias", a, 0, why, cap) || floats_arg("bias", a, 1, why, cap)) {
		return 1;
	}
	uint64_t m = a[2].value, nn = a[3].value;
	if (m * nn > 0x7fffffffu || a[0].len / 4 != m * nn || a[1].len / 4 != nn) {
		return REFUSE("bias: M=%llu N=%llu want x of M*N and b of N values; got %u and %u", (unsigned long long)m,
		              (unsigned long long)nn, a[0].len / 4, a[1].len / 4);
	}
	for (uint32_t i = 0; i < a[0].len / 4; i++) {
		putf(b[0], i, getf(b[0], i) + getf(b[1], i % (uint32_t)nn));
	}
	return 0;
}

static int k_matmul(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("matmul", n, 6, why, cap)) {
		return 1;
	}
	for (uint32_t i = 3; i < 6; i++) {
		if (scalar_arg("matmul", a, i, why, cap)) {
			return 1;
		}
	}
	for (uint32_t i = 0; i < 3; i++) {
		if (floats_arg("matmul", a, i, why, cap)) {
			return 1;
		}
	}
	uint64_t m = a[3].value, nn = a[4].value, k = a[5].value;
	if (m > 0x7fffffff || nn > 0x7fffffff || k > 0x7fffffff || m * k > 0x7fffffff || k * nn > 0x7fffffff || m * nn > 0x7fffffff) {
		return REFUSE("matmul: dimensions M=%llu N=%llu K=%llu too large", (unsigned long long)m, (unsigned long long)nn,
		              (unsigned long long)k);
	}
	if (a[0].len / 4 != m * k || a[1].len / 4 != k * nn || a[2].len / 4 != m * nn) {
		return REFUSE("matmul: M=%llu N=%llu K=%llu want A, B, C of %llu, %llu, %llu values; got %u, %u, %u",
		              (unsigned long long)m, (unsigned long long)nn, (unsigned long long)k, (unsigned long long)(m * k),
		              (unsigned long long)(k * nn), (unsigned long long)(m * nn), a[0].len / 4, a[1].len / 4, a[2].len / 4);
	}
	for (uint64_t i = 0; i < m; i++) {
		for (uint64_t j = 0; j < nn; j++) {
			float sum = 0;
			for (uint64_t p = 0; p < k; p++) {
				volatile float prod = getf(b[0], (uint32_t)(i * k + p)) * getf(b[1], (uint32_t)(p * nn + j));
				sum += prod;
			}
			putf(b[2], (uint32_t)(i * nn + j), sum);
		}
	}
	return 0;
}

static int k_argmax(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	if (want_args("argmax", n, 2, why, cap) || floats_arg("argmax", a, 0, why, cap)) {
		return 1;
	}
	if (!a[1].is_buf) {
		return REFUSE("kernel \"argmax\": argument 1 is a scalar, not a buffer");
	}
	if (a[0].len == 0) {
		return REFUSE("argmax: x is empty");
	}
	if (a[1].len < 8) {
		return REFUSE("argmax: out has %u bytes, want at least 8", a[1].len);
	}
	uint32_t best = 0;
	float bv = getf(b[0], 0);
	for (uint32_t i = 1; i < a[0].len / 4; i++) {
		if (getf(b[0], i) > bv) {
			best = i, bv = getf(b[0], i);
		}
	}
	memcpy(b[1], &best, 4);
	memcpy(b[1] + 4, &bv, 4);
	return 0;
}

/* mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C): a two-layer
 * perceptron on one input row, bit for bit what matmul, bias, relu,
 * matmul, bias and argmax write (the simulator's kernel). */
static int k_mlp_forward(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	const char *k = "mlp_forward";
	if (want_args(k, n, 10, why, cap)) {
		return 1;
	}
	for (uint32_t i = 7; i < 10; i++) {
		if (scalar_arg(k, a, i, why, cap)) {
			return 1;
		}
	}
	uint64_t in = a[7].value, hid = a[8].value, cls = a[9].value;
	if (in == 0 || in > 0x7fffffff || hid == 0 || hid > 1024 || cls == 0 || cls > 1024) {
		return REFUSE("mlp_forward: I=%llu H=%llu C=%llu: want I \u2265 1 and 1 \u2264 H, C \u2264 1024", (unsigned long long)in,
		              (unsigned long long)hid, (unsigned long long)cls);
	}
	uint64_t want[6] = {in, in * hid, hid, hid * cls, cls, cls};
	for (uint32_t i = 0; i < 6; i++) {
		if (floats_arg(k, a, i, why, cap)) {
			return 1;
		}
		if (a[i].len / 4 != want[i]) {
			return REFUSE("mlp_forward: I=%llu H=%llu C=%llu: argument %u has %u values, want %llu", (unsigned long long)in,
			              (unsigned long long)hid, (unsigned long long)cls, i, a[i].len / 4, (unsigned long long)want[i]);
		}
	}
	if (!a[6].is_buf) {
		return REFUSE("kernel \"mlp_forward\": argument 6 is a scalar, not a buffer");
	}
	if (a[6].len < 8) {
		return REFUSE("mlp_forward: argument 6 has %u bytes, want at least 8 (index, max)", a[6].len);
	}
	static const uint32_t outs[2] = {5, 6};
	for (uint32_t j = 0; j < 2; j++) {
		uint32_t o = outs[j];
		for (uint32_t i = 0; i < 7; i++) {
			uint64_t x = ((uint64_t)(a[o].buf + 1) << 40) + a[o].off, y = ((uint64_t)(a[i].buf + 1) << 40) + a[i].off;
			if (i != o && a[o].len && a[i].len && a[i].is_buf && x < y + a[i].len && y < x + a[o].len) {
				return REFUSE("mlp_forward: argument %u (an output) overlaps argument %u", o, i);
			}
		}
	}
	uint32_t nh = (uint32_t)hid, nc = (uint32_t)cls;
	float h[1024], scores[1024];
	for (uint32_t j = 0; j < nh; j++) {
		float sum = 0;
		for (uint32_t q = 0; q < (uint32_t)in; q++) {
			volatile float p = getf(b[0], q) * getf(b[1], q * nh + j);
			sum += p;
		}
		sum += getf(b[2], j);
		h[j] = sum < 0 ? 0 : sum;
	}
	for (uint32_t j = 0; j < nc; j++) {
		float sum = 0;
		for (uint32_t q = 0; q < nh; q++) {
			volatile float p = h[q] * getf(b[3], q * nc + j);
			sum += p;
		}
		scores[j] = sum + getf(b[4], j);
		putf(b[5], j, scores[j]);
	}
	uint32_t best = 0;
	float bv = scores[0];
	for (uint32_t j = 1; j < nc; j++) {
		if (scores[j] > bv) {
			best = j, bv = scores[j];
		}
	}
	memcpy(b[6], &best, 4);
	memcpy(b[6] + 4, &bv, 4);
	return 0;
}

/* The op library's reference: the fixed reduction order (256 lanes). */
static float fmax_(float a, float b) {
	if (a != a) return a;
	if (b != b) return b;
	if (a > b) return a;
	if (b > a) return b;
	return signbit(a) ? b : a;
}

static float tree_max(const uint8_t *row, uint32_t n) {
	float p[256];
	for (uint32_t t = 0; t < 256; t++) {
		p[t] = -INFINITY;
		for (uint32_t j = t; j < n; j += 256) {
			p[t] = fmax_(p[t], getf(row, j));
		}
	}
	for (uint32_t s = 128; s >= 1; s /= 2) {
		for (uint32_t t = 0; t < s; t++) {
			p[t] = fmax_(p[t], p[t + s]);
		}
	}
	return p[0];
}

static int k_softmax_(karg *a, uint8_t **b, int logs) {
	uint32_t rows = (uint32_t)a[2].value, cols = (uint32_t)a[3].value, sq = (uint32_t)a[4].value;
	float *y = xrealloc(NULL, (size_t)rows * cols * sizeof(float));
	for (uint32_t r = 0; r < rows; r++) {
		const uint8_t *row = b[0] + (size_t)4 * r * cols;
		uint32_t live = sq ? r % sq + (cols - sq) + 1 : cols;
		double m = tree_max(row, live), s = 0;
		for (uint32_t j = 0; j < live; j++) {
			s += exp((double)getf(row, j) - m);
		}
		for (uint32_t j = 0; j < cols; j++) {
			double v = getf(row, j);
			float o;
			if (j < live) {
				o = logs ? (float)((v - m) - log(s)) : (float)(exp(v - m) / s);
			} else {
				o = logs ? -INFINITY : 0.0f;
			}
			y[(size_t)r * cols + j] = o;
		}
	}
	memcpy(b[1], y, (size_t)rows * cols * 4);
	free(y);
	return 0;
}
static int k_softmax(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_softmax_(a, b, 0);
}
static int k_log_softmax(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_softmax_(a, b, 1);
}

/* The emulated device address of byte off of buffer b. */
static uint64_t address(const karg *a) { return ((uint64_t)(a->buf + 1) << 40) + a->off; }

static void num(char *dst, size_t cap, uint64_t v) { /* 4,096 */
	char s[32];
	int n = snprintf(s, sizeof s, "%llu", (unsigned long long)v), o = 0, lead = n % 3;
	for (int i = 0; i < n && o + 2 < (int)cap; i++) {
		if (i > 0 && (i - lead) % 3 == 0) {
			dst[o++] = ',';
		}
		dst[o++] = s[i];
	}
	dst[o] = 0;
}

static uint32_t dsize(uint8_t dtype);
static const char *dname(uint8_t dtype);

/* softmax's contract (hw/internal/ops), in its words. */
static int check_softmax(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	static const char *names[] = {"x", "y", "rows", "cols", "causal"};
	char n1[32], n2[32];
	if (n != 5) {
		return REFUSE("%s: takes 5 arguments, got %u", k, n);
	}
	for (uint32_t i = 0; i < 5; i++) {
		if (i < 2 && !a[i].is_buf) {
			return REFUSE("%s: %s (argument %u) is a scalar, want a buffer range", k, names[i], i);
		}
		if (i < 2 && a[i].len % dsize(a[i].dtype)) {
			num(n1, sizeof n1, a[i].len);
			return REFUSE("%s: %s has %s bytes, not a whole number of %s values", k, names[i], n1, dname(a[i].dtype));
		}
		if (i < 2 && a[i].len && address(&a[i]) % dsize(a[i].dtype)) {
			return REFUSE("%s: %s is not %u-byte aligned", k, names[i], dsize(a[i].dtype));
		}
		if (i >= 2 && a[i].is_buf) {
			return REFUSE("%s: %s (argument %u) is a buffer range, want a scalar", k, names[i], i);
		}
		if (i >= 2 && a[i].value > 0xffffffffu) {
			num(n1, sizeof n1, a[i].value);
			return REFUSE("%s: %s = %s does not fit 32 bits", k, names[i], n1);
		}
	}
	for (uint32_t i = 2; i < 4; i++) {
		if (a[i].value == 0) {
			return REFUSE("%s: %s = 0: dimensions must be at least 1", k, names[i]);
		}
		if (a[i].value > 0x7fffffff) {
			num(n1, sizeof n1, a[i].value);
			return REFUSE("%s: %s = %s exceeds the limit 2,147,483,647", k, names[i], n1);
		}
	}
	uint64_t rc = a[2].value * a[3].value;
	if (rc > 0x7fffffff) {
		return REFUSE("%s: rows*cols exceeds the limit 2,147,483,647", k);
	}
	for (uint32_t i = 0; i < 2; i++) {
		if (a[i].len / dsize(a[i].dtype) != rc) {
			num(n1, sizeof n1, a[i].len / dsize(a[i].dtype));
			num(n2, sizeof n2, rc);
			return REFUSE("%s: %s has %s values, rows*cols = %s", k, names[i], n1, n2);
		}
	}
	uint64_t x = address(&a[0]), y = address(&a[1]);
	int overlap = a[0].len && a[1].len && x < y + a[1].len && y < x + a[0].len;
	if (overlap && !(x == y && a[0].len == a[1].len)) {
		return REFUSE("%s: y partially overlaps x (it may be exactly x, or apart)", k);
	}
	if (a[4].value > a[3].value) {
		num(n1, sizeof n1, a[4].value);
		num(n2, sizeof n2, a[3].value);
		return REFUSE("%s: causal = %s exceeds cols = %s", k, n1, n2);
	}
	return 0;
}

/* The op library's generic checks (hw/internal/ops), in its words: an op
 * is its argument names, kinds ('b' buffer, 's' scalar) and types. */
typedef struct opinfo {
	const char *name;
	int nargs;
	const char *names[16];
	const char *kinds; /* per argument: b or s */
	const char *types; /* per argument: f (f32), i (i32), u (u32) */
} opinfo;

typedef struct launch_ {
	const opinfo *op;
	const karg *a;
	char *why;
	size_t cap;
} launch_;

static int lidx(const launch_ *l, const char *name) {
	for (int i = 0; i < l->op->nargs; i++) {
		if (strcmp(l->op->names[i], name) == 0) {
			return i;
		}
	}
	abort();
}
static uint64_t lscalar(const launch_ *l, const char *name) { return l->a[lidx(l, name)].value; }
static uint64_t lcount(const launch_ *l, const char *name) {
	const karg *a = &l->a[lidx(l, name)];
	return a->len / dsize(a->dtype);
}

#define LREFUSE(l, ...) (lrefuse((l), __VA_ARGS__))
static int lrefuse(const launch_ *l, const char *fmt, ...) {
	char m[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	snprintf(l->why, l->cap, "%s: %s", l->op->name, m);
	return 1;
}

static int ldim(const launch_ *l, const char *name, uint64_t *v) {
	char n1[32];
	*v = lscalar(l, name);
	if (*v == 0) {
		return LREFUSE(l, "%s = 0: dimensions must be at least 1", name);
	}
	if (*v > 0x7fffffff) {
		num(n1, sizeof n1, *v);
		return LREFUSE(l, "%s = %s exceeds the limit 2,147,483,647", name, n1);
	}
	return 0;
}

static int lproduct(const launch_ *l, const char *expr, const uint64_t *vs, int n, uint64_t *out) {
	uint64_t p = 1;
	for (int i = 0; i < n; i++) {
		unsigned __int128 q = (unsigned __int128)p * vs[i];
		if (q > 0x7fffffff) {
			return LREFUSE(l, "%s exceeds the limit 2,147,483,647", expr);
		}
		p = (uint64_t)q;
	}
	*out = p;
	return 0;
}

static int lwant(const launch_ *l, const char *name, uint64_t want, const char *expr) {
	char n1[32], n2[32];
	uint64_t got = lcount(l, name);
	if (got != want) {
		num(n1, sizeof n1, got);
		num(n2, sizeof n2, want);
		return LREFUSE(l, "%s has %s values, %s = %s", name, n1, expr, n2);
	}
	return 0;
}

static int loverlap(const launch_ *l, const char *x, const char *y, int *same) {
	const karg *p = &l->a[lidx(l, x)], *q = &l->a[lidx(l, y)];
	uint64_t a = address(p), b = address(q);
	*same = a == b && p->len == q->len;
	return p->len && q->len && a < b + q->len && b < a + p->len;
}

static int ldisjoint(const launch_ *l, const char *out, const char *in) {
	int same;
	if (loverlap(l, out, in, &same)) {
		return LREFUSE(l, "%s overlaps %s", out, in);
	}
	return 0;
}

static int linplace(const launch_ *l, const char *out, const char *in) {
	int same;
	if (loverlap(l, out, in, &same) && !same) {
		return LREFUSE(l, "%s partially overlaps %s (it may be exactly %s, or apart)", out, in, in);
	}
	return 0;
}

static uint32_t dsize(uint8_t dtype) { return dtype == 1 || dtype == 2 ? 2 : dtype == 4 ? 1 : 4; }
static const char *dname(uint8_t dtype) {
	static const char *n[] = {"f32", "f16", "bf16", "i32", "bytes"};
	return dtype < 5 ? n[dtype] : "f32";
}

static int lgeneric(const launch_ *l, uint32_t n) {
	char n1[32];
	if ((int)n != l->op->nargs) {
		return LREFUSE(l, "takes %d arguments, got %u", l->op->nargs, n);
	}
	for (int i = 0; i < l->op->nargs; i++) {
		const char *nm = l->op->names[i];
		if (l->op->kinds[i] == 'b') {
			if (!l->a[i].is_buf) {
				return LREFUSE(l, "%s (argument %d) is a scalar, want a buffer range", nm, i);
			}
			uint32_t es = dsize(l->a[i].dtype);
			if (l->a[i].len % es) {
				num(n1, sizeof n1, l->a[i].len);
				return LREFUSE(l, "%s has %s bytes, not a whole number of %s values", nm, n1, dname(l->a[i].dtype));
			}
			if (l->a[i].len && address(&l->a[i]) % es) {
				return LREFUSE(l, "%s is not %u-byte aligned", nm, es);
			}
		} else {
			if (l->a[i].is_buf) {
				return LREFUSE(l, "%s (argument %d) is a buffer range, want a scalar", nm, i);
			}
			if (l->op->types[i] != 'U' && l->a[i].value > 0xffffffffu) {
				num(n1, sizeof n1, l->a[i].value);
				return LREFUSE(l, "%s = %s does not fit 32 bits", nm, n1);
			}
		}
	}
	return 0;
}

static int lrows_cols(const launch_ *l, uint64_t *cols) {
	uint64_t d[2], n;
	if (ldim(l, "rows", &d[0]) || ldim(l, "cols", &d[1]) || lproduct(l, "rows*cols", d, 2, &n) ||
	    lwant(l, "x", n, "rows*cols") || lwant(l, "y", n, "rows*cols") || linplace(l, "y", "x")) {
		return 1;
	}
	*cols = d[1];
	return 0;
}

static const opinfo op_layernorm = {"layernorm", 7, {"x", "gamma", "beta", "y", "rows", "cols", "eps"}, "bbbbsss", "ffffuuf"};
static const opinfo op_rmsnorm = {"rmsnorm", 6, {"x", "gamma", "y", "rows", "cols", "eps"}, "bbbsss", "fffuuf"};
static const opinfo op_transpose = {"transpose", 10, {"x", "y", "d0", "d1", "d2", "d3", "p0", "p1", "p2", "p3"}, "bbssssssss", "ffuuuuuuuu"};
static const opinfo op_gemm = {"gemm", 14,
                               {"A", "B", "C", "M", "N", "K", "transA", "transB", "alpha", "beta", "batch", "strideA", "strideB", "strideC"},
                               "bbbsssssssssss", "fffuuuuuffuuuu"};
static const opinfo op_gather = {"gather", 5, {"table", "idx", "out", "rows", "cols"}, "bbbss", "fifuu"};

static int check_norm(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	int ln = strcmp(k, "layernorm") == 0;
	launch_ l = {ln ? &op_layernorm : &op_rmsnorm, a, why, cap};
	uint64_t cols;
	if (lgeneric(&l, n) || lrows_cols(&l, &cols) || lwant(&l, "gamma", cols, "cols") || (ln && lwant(&l, "beta", cols, "cols"))) {
		return 1;
	}
	return ldisjoint(&l, "y", "gamma") || (ln && ldisjoint(&l, "y", "beta"));
}

static int check_transpose(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	(void)k;
	launch_ l = {&op_transpose, a, why, cap};
	static const char *dn[4] = {"d0", "d1", "d2", "d3"}, *pn[4] = {"p0", "p1", "p2", "p3"};
	uint64_t d[4], total;
	int seen[4] = {0};
	if (lgeneric(&l, n)) {
		return 1;
	}
	for (int i = 0; i < 4; i++) {
		if (ldim(&l, dn[i], &d[i])) {
			return 1;
		}
	}
	for (int i = 0; i < 4; i++) {
		uint64_t p = lscalar(&l, pn[i]);
		if (p > 3 || seen[p]) {
			return LREFUSE(&l, "p0..p3 = %llu %llu %llu %llu is not a permutation of 0..3", (unsigned long long)lscalar(&l, "p0"),
			               (unsigned long long)lscalar(&l, "p1"), (unsigned long long)lscalar(&l, "p2"), (unsigned long long)lscalar(&l, "p3"));
		}
		seen[p] = 1;
	}
	return lproduct(&l, "d0*d1*d2*d3", d, 4, &total) || lwant(&l, "x", total, "d0*d1*d2*d3") || lwant(&l, "y", total, "d0*d1*d2*d3") ||
	       ldisjoint(&l, "y", "x");
}

static int check_gemm(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_gemm;
	op.name = k; /* gemm or gemm.fast */
	launch_ l = {&op, a, why, cap};
	char n1[32], n2[32];
	uint64_t m, nn, kk, batch;
	if (lgeneric(&l, n) || ldim(&l, "M", &m) || ldim(&l, "N", &nn) || ldim(&l, "K", &kk) || ldim(&l, "batch", &batch)) {
		return 1;
	}
	static const char *ts[2] = {"transA", "transB"};
	for (int i = 0; i < 2; i++) {
		uint64_t v = lscalar(&l, ts[i]);
		if (v > 1) {
			num(n1, sizeof n1, v);
			return LREFUSE(&l, "%s = %s, want 0 or 1", ts[i], n1);
		}
	}
	struct {
		const char *buf, *stride, *expr;
		uint64_t x, y;
	} ms[3] = {{"A", "strideA", "(batch-1)*strideA + M*K", m, kk},
	           {"B", "strideB", "(batch-1)*strideB + K*N", kk, nn},
	           {"C", "strideC", "(batch-1)*strideC + M*N", m, nn}};
	for (int i = 0; i < 3; i++) {
		uint64_t xy[2] = {ms[i].x, ms[i].y}, size, off;
		if (lproduct(&l, ms[i].expr, xy, 2, &size)) {
			return 1;
		}
		uint64_t st = lscalar(&l, ms[i].stride);
		if (i == 2 && batch > 1 && st < size) {
			num(n1, sizeof n1, st);
			num(n2, sizeof n2, size);
			return LREFUSE(&l, "strideC = %s is less than M*N = %s: the batch's C matrices would overlap", n1, n2);
		}
		uint64_t bs[2] = {batch - 1, st};
		if (lproduct(&l, ms[i].expr, bs, 2, &off)) {
			return 1;
		}
		if (off + size > 0x7fffffff) {
			return LREFUSE(&l, "%s exceeds the limit 2,147,483,647", ms[i].expr);
		}
		if (lwant(&l, ms[i].buf, off + size, ms[i].expr)) {
			return 1;
		}
	}
	return ldisjoint(&l, "C", "A") || ldisjoint(&l, "C", "B");
}

static int check_gather(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	(void)k;
	launch_ l = {&op_gather, a, why, cap};
	uint64_t d[2], total, no;
	if (lgeneric(&l, n) || ldim(&l, "rows", &d[0]) || ldim(&l, "cols", &d[1]) || lproduct(&l, "rows*cols", d, 2, &total) ||
	    lwant(&l, "table", total, "rows*cols")) {
		return 1;
	}
	uint64_t ni = lcount(&l, "idx");
	if (ni == 0) {
		return LREFUSE(&l, "idx has 0 values: zero-size launches are refused");
	}
	uint64_t nc[2] = {ni, d[1]};
	return lproduct(&l, "len(idx)*cols", nc, 2, &no) || lwant(&l, "out", no, "len(idx)*cols") || ldisjoint(&l, "out", "table") ||
	       ldisjoint(&l, "out", "idx");
}

static const opinfo op_conv = {"conv2d", 15,
                               {"x", "w", "bias", "y", "N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dil", "groups"},
                               "bbbbsssssssssss", "ffffuuuuuuuUUUu"};
static const opinfo op_pool = {"maxpool2d", 10, {"x", "y", "N", "C", "H", "W", "R", "S", "stride", "pad"}, "bbssssssss", "ffuuuuuuUU"};

static int lwindow(const launch_ *l, const char *axis, uint64_t in, uint64_t r, uint64_t stride, uint64_t pad, uint64_t dil, uint64_t *out) {
	char n1[32], n2[32];
	uint64_t span = dil * (r - 1) + 1;
	if (in + 2 * pad < span) {
		num(n1, sizeof n1, span);
		num(n2, sizeof n2, in + 2 * pad);
		return LREFUSE(l, "the %s window spans %s values, more than the padded input's %s: the output would be empty", axis, n1, n2);
	}
	*out = (in + 2 * pad - span) / stride + 1;
	return 0;
}

static int lgeometry(const launch_ *l, uint64_t h, uint64_t w, uint64_t r, uint64_t s, int with_dil, uint64_t *p, uint64_t *q) {
	uint64_t st = lscalar(l, "stride"), pd = lscalar(l, "pad"), dl = with_dil ? lscalar(l, "dil") : (1 | (uint64_t)1 << 32);
	uint64_t sh = st & 0xffffffffu, sw = st >> 32, ph = pd & 0xffffffffu, pw = pd >> 32, dh = dl & 0xffffffffu, dw = dl >> 32;
	if (sh == 0 || sw == 0) {
		return LREFUSE(l, "stride = (%llu, %llu): both halves must be at least 1", (unsigned long long)sh, (unsigned long long)sw);
	}
	if (dh == 0 || dw == 0) {
		return LREFUSE(l, "dil = (%llu, %llu): both halves must be at least 1", (unsigned long long)dh, (unsigned long long)dw);
	}
	return lwindow(l, "height", h, r, sh, ph, dh, p) || lwindow(l, "width", w, s, sw, pw, dw, q);
}

static int check_conv(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_conv;
	op.name = k; /* conv2d or conv2d.fast */
	launch_ l = {&op, a, why, cap};
	static const char *dn[8] = {"N", "C", "H", "W", "K", "R", "S", "groups"};
	uint64_t d[8], p, q, nx, nw, ny;
	char n1[32], n2[32], n3[32];
	if (lgeneric(&l, n)) {
		return 1;
	}
	for (int i = 0; i < 8; i++) {
		if (ldim(&l, dn[i], &d[i])) {
			return 1;
		}
	}
	if (d[1] % d[7] || d[4] % d[7]) {
		num(n1, sizeof n1, d[7]);
		num(n2, sizeof n2, d[1]);
		num(n3, sizeof n3, d[4]);
		return LREFUSE(&l, "groups = %s divides neither C = %s nor K = %s evenly", n1, n2, n3);
	}
	uint64_t vx[4] = {d[0], d[1], d[2], d[3]}, vw[4] = {d[4], d[1] / d[7], d[5], d[6]};
	if (lgeometry(&l, d[2], d[3], d[5], d[6], 1, &p, &q) || lproduct(&l, "N*C*H*W", vx, 4, &nx) ||
	    lproduct(&l, "K*(C/groups)*R*S", vw, 4, &nw)) {
		return 1;
	}
	uint64_t vy[4] = {d[0], d[4], p, q};
	if (lproduct(&l, "N*K*P*Q", vy, 4, &ny) || lwant(&l, "x", nx, "N*C*H*W") || lwant(&l, "w", nw, "K*(C/groups)*R*S")) {
		return 1;
	}
	uint64_t nb = lcount(&l, "bias");
	if (nb != 0 && nb != d[4]) {
		num(n1, sizeof n1, nb);
		num(n2, sizeof n2, d[4]);
		return LREFUSE(&l, "bias has %s values, want K = %s or none", n1, n2);
	}
	return lwant(&l, "y", ny, "N*K*P*Q") || ldisjoint(&l, "y", "x") || ldisjoint(&l, "y", "w") || ldisjoint(&l, "y", "bias");
}

static int check_pool(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_pool;
	op.name = k;
	launch_ l = {&op, a, why, cap};
	static const char *dn[6] = {"N", "C", "H", "W", "R", "S"};
	uint64_t d[6], p, q, nx, ny;
	if (lgeneric(&l, n)) {
		return 1;
	}
	for (int i = 0; i < 6; i++) {
		if (ldim(&l, dn[i], &d[i])) {
			return 1;
		}
	}
	if (lgeometry(&l, d[2], d[3], d[4], d[5], 0, &p, &q) || lproduct(&l, "N*C*H*W", d, 4, &nx)) {
		return 1;
	}
	uint64_t vy[4] = {d[0], d[1], p, q};
	return lproduct(&l, "N*C*P*Q", vy, 4, &ny) || lwant(&l, "x", nx, "N*C*H*W") || lwant(&l, "y", ny, "N*C*P*Q") || ldisjoint(&l, "y", "x");
}

static int k_conv(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	int64_t nn = (int64_t)a[4].value, c = (int64_t)a[5].value, h = (int64_t)a[6].value, w = (int64_t)a[7].value, k = (int64_t)a[8].value,
	        r = (int64_t)a[9].value, s = (int64_t)a[10].value, g = (int64_t)a[14].value;
	int64_t sh = (int64_t)(a[11].value & 0xffffffffu), sw = (int64_t)(a[11].value >> 32);
	int64_t ph = (int64_t)(a[12].value & 0xffffffffu), pw = (int64_t)(a[12].value >> 32);
	int64_t dh = (int64_t)(a[13].value & 0xffffffffu), dw = (int64_t)(a[13].value >> 32);
	int64_t p = (h + 2 * ph - dh * (r - 1) - 1) / sh + 1, q = (w + 2 * pw - dw * (s - 1) - 1) / sw + 1;
	int64_t cg = c / g, kg = k / g;
	for (int64_t ni = 0; ni < nn; ni++)
		for (int64_t ki = 0; ki < k; ki++) {
			int64_t c0 = (ki / kg) * cg;
			for (int64_t pi = 0; pi < p; pi++)
				for (int64_t qi = 0; qi < q; qi++) {
					float sum = 0;
					for (int64_t ci = 0; ci < cg; ci++)
						for (int64_t ri = 0; ri < r; ri++) {
							int64_t hi = pi * sh - ph + ri * dh;
							if (hi < 0 || hi >= h) {
								continue;
							}
							for (int64_t si = 0; si < s; si++) {
								int64_t wi = qi * sw - pw + si * dw;
								if (wi < 0 || wi >= w) {
									continue;
								}
								volatile float prod = getf(b[0], (uint32_t)(((ni * c + c0 + ci) * h + hi) * w + wi)) *
								                      getf(b[1], (uint32_t)(((ki * cg + ci) * r + ri) * s + si));
								sum += prod;
							}
						}
					if (a[2].len) {
						sum += getf(b[2], (uint32_t)ki);
					}
					putf(b[3], (uint32_t)(((ni * k + ki) * p + pi) * q + qi), sum);
				}
		}
	return 0;
}

static int k_pool_(karg *a, uint8_t **b, int is_max) {
	int64_t nn = (int64_t)a[2].value, c = (int64_t)a[3].value, h = (int64_t)a[4].value, w = (int64_t)a[5].value, r = (int64_t)a[6].value,
	        s = (int64_t)a[7].value;
	int64_t sh = (int64_t)(a[8].value & 0xffffffffu), sw = (int64_t)(a[8].value >> 32);
	int64_t ph = (int64_t)(a[9].value & 0xffffffffu), pw = (int64_t)(a[9].value >> 32);
	int64_t p = (h + 2 * ph - r) / sh + 1, q = (w + 2 * pw - s) / sw + 1;
	for (int64_t nc = 0; nc < nn * c; nc++)
		for (int64_t pi = 0; pi < p; pi++)
			for (int64_t qi = 0; qi < q; qi++) {
				float acc = is_max ? -INFINITY : 0.0f;
				int count = 0;
				for (int64_t ri = 0; ri < r; ri++) {
					int64_t hi = pi * sh - ph + ri;
					if (hi < 0 || hi >= h) {
						continue;
					}
					for (int64_t si = 0; si < s; si++) {
						int64_t wi = qi * sw - pw + si;
						if (wi < 0 || wi >= w) {
							continue;
						}
						float v = getf(b[0], (uint32_t)(nc * h * w + hi * w + wi));
						acc = is_max ? fmax_(acc, v) : acc + v;
						count++;
					}
				}
				if (!is_max && count > 0) {
					acc /= (float)count;
				}
				putf(b[1], (uint32_t)((nc * p + pi) * q + qi), acc);
			}
	return 0;
}
static int k_maxpool(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_pool_(a, b, 1);
}
static int k_avgpool(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_pool_(a, b, 0);
}

static float tree_sum(const float *v, uint32_t n, const float *sq) {
	/* the fixed reduction order; sq: sum v[j]*sq[j] (squares) when set */
	float p[256] = {0};
	for (uint32_t t = 0; t < 256 && t < n; t++) {
		float s = 0;
		for (uint32_t j = t; j < n; j += 256) {
			volatile float term = sq ? v[j] * sq[j] : v[j];
			s += term;
		}
		p[t] = s;
	}
	for (uint32_t s = 128; s >= 1; s /= 2) {
		for (uint32_t t = 0; t < s; t++) {
			p[t] += p[t + s];
		}
	}
	return p[0];
}

static float *loadf(const uint8_t *b, uint32_t len) {
	float *v = xrealloc(NULL, len ? len : 4);
	memcpy(v, b, len);
	return v;
}

static int k_norm_(karg *a, uint8_t **b, int ln) {
	uint32_t rows = (uint32_t)a[ln ? 4 : 3].value, cols = (uint32_t)a[ln ? 5 : 4].value;
	float eps = scalar_f32(&a[ln ? 6 : 5]);
	float *x = loadf(b[0], a[0].len), *g = loadf(b[1], a[1].len), *be = ln ? loadf(b[2], a[2].len) : NULL;
	float *d = xrealloc(NULL, (size_t)cols * 4);
	float n = (float)cols;
	for (uint32_t r = 0; r < rows; r++) {
		float *row = x + (size_t)r * cols;
		if (ln) {
			float mean = tree_sum(row, cols, NULL) / n;
			for (uint32_t j = 0; j < cols; j++) {
				d[j] = row[j] - mean;
			}
			float var = tree_sum(d, cols, d) / n;
			volatile float sq = (float)sqrt((double)(var + eps));
			float inv = 1.0f / sq;
			for (uint32_t j = 0; j < cols; j++) {
				volatile float t = d[j] * inv;
				volatile float u = t * g[j];
				row[j] = u + be[j];
			}
		} else {
			float ms = tree_sum(row, cols, row) / n;
			volatile float sq = (float)sqrt((double)(ms + eps));
			float inv = 1.0f / sq;
			for (uint32_t j = 0; j < cols; j++) {
				volatile float t = row[j] * inv;
				row[j] = t * g[j];
			}
		}
	}
	memcpy(b[ln ? 3 : 2], x, a[0].len);
	free(x), free(g), free(be), free(d);
	return 0;
}
static int k_layernorm(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_norm_(a, b, 1);
}
static int k_rmsnorm(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	return k_norm_(a, b, 0);
}

static int k_transpose(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	size_t d[4], p[4], xs[4], e[4], es[4], s = 1;
	for (int i = 0; i < 4; i++) {
		d[i] = (size_t)a[2 + i].value, p[i] = (size_t)a[6 + i].value;
	}
	for (int i = 3; i >= 0; i--) {
		xs[i] = s, s *= d[i];
	}
	for (int i = 0; i < 4; i++) {
		e[i] = d[p[i]], es[i] = xs[p[i]];
	}
	size_t k = 0;
	for (size_t i0 = 0; i0 < e[0]; i0++)
		for (size_t i1 = 0; i1 < e[1]; i1++)
			for (size_t i2 = 0; i2 < e[2]; i2++)
				for (size_t i3 = 0; i3 < e[3]; i3++) {
					memcpy(b[1] + 4 * k++, b[0] + 4 * (i0 * es[0] + i1 * es[1] + i2 * es[2] + i3 * es[3]), 4);
				}
	return 0;
}

static int k_gemm(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	size_t m = (size_t)a[3].value, nn = (size_t)a[4].value, k = (size_t)a[5].value;
	int ta = a[6].value == 1, tb = a[7].value == 1;
	float alpha = scalar_f32(&a[8]), beta = scalar_f32(&a[9]);
	size_t batch = (size_t)a[10].value, sa = (size_t)a[11].value, sb = (size_t)a[12].value, sc = (size_t)a[13].value;
	for (size_t bi = 0; bi < batch; bi++) {
		for (size_t i = 0; i < m; i++) {
			for (size_t j = 0; j < nn; j++) {
				float sum = 0;
				for (size_t p = 0; p < k; p++) {
					float av = getf(b[0], (uint32_t)(bi * sa + (ta ? p * m + i : i * k + p)));
					float bv = getf(b[1], (uint32_t)(bi * sb + (tb ? j * k + p : p * nn + j)));
					volatile float prod = av * bv;
					sum += prod;
				}
				volatile float v = alpha * sum;
				if (beta != 0) {
					volatile float c = beta * getf(b[2], (uint32_t)(bi * sc + i * nn + j));
					v = v + c;
				}
				putf(b[2], (uint32_t)(bi * sc + i * nn + j), v);
			}
		}
	}
	return 0;
}

static int k_gather(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	uint32_t rows = (uint32_t)a[3].value, cols = (uint32_t)a[4].value, w = 4 * cols;
	for (uint32_t i = 0; i < a[1].len / 4; i++) {
		int32_t r;
		memcpy(&r, b[1] + 4 * i, 4);
		if (r < 0 || (uint32_t)r >= rows) {
			memset(b[2] + (size_t)i * w, 0, w);
		} else {
			memcpy(b[2] + (size_t)i * w, b[0] + (size_t)r * w, w);
		}
	}
	return 0;
}

/* Half storage (hw/internal/ops/half.go), bit for bit. */
static uint16_t f32_to_f16(float f) {
	uint32_t b;
	memcpy(&b, &f, 4);
	uint16_t sign = (uint16_t)(b >> 16) & 0x8000;
	int exp = (int)(b >> 23) & 0xff;
	uint32_t man = b & 0x7fffff;
	if (exp == 0xff) {
		return man ? (uint16_t)(sign | 0x7e00 | (man >> 13)) : (uint16_t)(sign | 0x7c00);
	}
	int e = exp - 127 + 15;
	if (e >= 0x1f) {
		return sign | 0x7c00;
	}
	if (e <= 0) {
		unsigned shift = (unsigned)(14 - e);
		if (shift > 24 || exp == 0) {
			return sign;
		}
		uint32_t m = man | 0x800000, r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (r & 1))) {
			r++;
		}
		return (uint16_t)(sign | r);
	}
	uint32_t h = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
		h++;
	}
	return (uint16_t)(sign | h);
}
static float u2f(uint32_t u) {
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static uint32_t f2u(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static float f16_to_f32(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0) {
		return u2f(f2u((float)m * (1.0f / 16777216.0f)) | sign);
	}
	if (e == 0x1f) {
		return u2f(sign | 0x7f800000 | m << 13);
	}
	return u2f(sign | (e + 127 - 15) << 23 | m << 13);
}
static uint16_t f32_to_bf16(float f) {
	uint32_t b = f2u(f);
	if ((b & 0x7fffffff) > 0x7f800000) {
		return (uint16_t)((b >> 16) | 0x40);
	}
	b += 0x7fff + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}
static float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }
static int32_t f32_to_i32(float f) {
	if (f != f) {
		return 0;
	}
	if (f >= 2147483648.0f) {
		return INT32_MAX;
	}
	if (f <= -2147483648.0f) {
		return INT32_MIN;
	}
	return (int32_t)f;
}
static uint16_t i32_to_bf16(int32_t v) {
	uint64_t a = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v;
	float sign = v < 0 ? -1.0f : 1.0f;
	int n = 0;
	for (uint64_t t = a; t; t >>= 1) {
		n++;
	}
	if (n <= 8) {
		return f32_to_bf16(sign * (float)a);
	}
	unsigned shift = (unsigned)(n - 8);
	uint64_t r = a >> shift, rem = a & ((1ull << shift) - 1), halfway = 1ull << (shift - 1);
	if (rem > halfway || (rem == halfway && (r & 1))) {
		r++;
	}
	return f32_to_bf16(sign * (float)(r << shift));
}

/* Elementwise ops, reductions and cast (float32 arithmetic; the values of
 * half storage are converted at the kernel's boundary, in retire). */
static float u_exp(float x) { return (float)exp((double)x); }
static float u_log(float x) { return (float)log((double)x); }
static float u_tanh(float x) { return (float)tanh((double)x); }
static double sigmoid64(double x) { return 1 / (1 + exp(-x)); }
static float u_sigmoid(float x) { return (float)sigmoid64((double)x); }
static float u_silu(float x) { return x == -INFINITY ? -0.0f : (float)((double)x * sigmoid64((double)x)); }
/* gelu_tanh: x·sigmoid(2u), u = √(2/π)(x + 0.044715x³); gelu_erf:
 * 0.5x·erfc(-x/√2); both in float64 rounded once, -Inf gives -0, as the
 * op library computes them. */
static float u_gelu_tanh(float x) {
	if (x == -INFINITY) {
		return -0.0f;
	}
	double v = (double)x, u = sqrt(2 / 3.14159265358979323846264338327950288) * (v + 0.044715 * v * v * v);
	return (float)(v * sigmoid64(2 * u));
}
static float u_gelu_erf(float x) {
	if (x == -INFINITY) {
		return -0.0f;
	}
	double v = (double)x;
	return (float)(0.5 * v * erfc(-v / 1.41421356237309504880168872420969808));
}
static float u_sqrt(float x) { return (float)sqrt((double)x); }
static float u_rsqrt(float x) {
	volatile float s = u_sqrt(x);
	return 1.0f / s;
}
static float u_neg(float x) { return u2f(f2u(x) ^ 0x80000000u); }
static float u_abs(float x) { return u2f(f2u(x) & 0x7fffffffu); }

static const struct {
	const char *name;
	float (*f)(float);
} unary_ops[] = {{"exp", u_exp},   {"log", u_log},   {"tanh", u_tanh},   {"sigmoid", u_sigmoid}, {"silu", u_silu},
                 {"sqrt", u_sqrt}, {"rsqrt", u_rsqrt}, {"neg", u_neg},   {"abs", u_abs},
                 {"gelu_tanh", u_gelu_tanh}, {"gelu_erf", u_gelu_erf}};

static const opinfo op_unary = {"unary", 2, {"x", "y"}, "bb", "ff"};
static const opinfo op_affine = {"affine", 4, {"x", "y", "a", "b"}, "bbss", "ffFF"};
static const opinfo op_binary = {"binary", 11, {"a", "b", "c", "a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"}, "bbbssssssss", "fffuuuuuuuu"};
static const opinfo op_reduce = {"reduce", 5, {"x", "y", "outer", "n", "inner"}, "bbsss", "ffuuu"};
static const opinfo op_cast = {"cast", 4, {"x", "y", "from", "to"}, "bbss", "BBuu"};

static int check_unary(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = strcmp(k, "affine") == 0 || strncmp(k, "affine.", 7) == 0 ? op_affine : op_unary;
	op.name = k;
	launch_ l = {&op, a, why, cap};
	if (lgeneric(&l, n)) {
		return 1;
	}
	uint64_t c = lcount(&l, "x");
	if (c == 0) {
		return LREFUSE(&l, "x has 0 values: zero-size launches are refused");
	}
	return lwant(&l, "y", c, "len(x)") || linplace(&l, "y", "x");
}

static int check_binary(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_binary;
	op.name = k;
	launch_ l = {&op, a, why, cap};
	static const char *an[4] = {"a0", "a1", "a2", "a3"}, *bn[4] = {"b0", "b1", "b2", "b3"};
	uint64_t av[4], bv[4], cv[4], na, nb, nc;
	char n1[32], n2[32];
	if (lgeneric(&l, n)) {
		return 1;
	}
	for (int i = 0; i < 4; i++) {
		if (ldim(&l, an[i], &av[i])) {
			return 1;
		}
	}
	for (int i = 0; i < 4; i++) {
		if (ldim(&l, bn[i], &bv[i])) {
			return 1;
		}
	}
	for (int i = 0; i < 4; i++) {
		if (av[i] == bv[i] || bv[i] == 1) {
			cv[i] = av[i];
		} else if (av[i] == 1) {
			cv[i] = bv[i];
		} else {
			num(n1, sizeof n1, av[i]);
			num(n2, sizeof n2, bv[i]);
			return LREFUSE(&l, "dim %d: a%d = %s and b%d = %s do not broadcast", i, i, n1, i, n2);
		}
	}
	if (lproduct(&l, "a0*a1*a2*a3", av, 4, &na) || lproduct(&l, "b0*b1*b2*b3", bv, 4, &nb) || lproduct(&l, "the broadcast shape", cv, 4, &nc) ||
	    lwant(&l, "a", na, "a0*a1*a2*a3") || lwant(&l, "b", nb, "b0*b1*b2*b3") || lwant(&l, "c", nc, "the broadcast shape's product")) {
		return 1;
	}
	const char *ins[2] = {"a", "b"};
	uint64_t ns[2] = {na, nb};
	for (int i = 0; i < 2; i++) {
		int same;
		int ov = loverlap(&l, "c", ins[i], &same);
		if (same && ns[i] == nc) {
			continue;
		}
		if (ov) {
			if (ns[i] != nc) {
				return LREFUSE(&l, "c overlaps %s, which is broadcast (only an operand of c's shape may be c)", ins[i]);
			}
			return LREFUSE(&l, "c partially overlaps %s (it may be exactly %s, or apart)", ins[i], ins[i]);
		}
	}
	return 0;
}

static int check_reduce(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_reduce;
	op.name = k;
	launch_ l = {&op, a, why, cap};
	uint64_t d[3], nx, ny;
	if (lgeneric(&l, n) || ldim(&l, "outer", &d[0]) || ldim(&l, "n", &d[1]) || ldim(&l, "inner", &d[2]) || lproduct(&l, "outer*n*inner", d, 3, &nx)) {
		return 1;
	}
	uint64_t oi[2] = {d[0], d[2]};
	return lproduct(&l, "outer*inner", oi, 2, &ny) || lwant(&l, "x", nx, "outer*n*inner") || lwant(&l, "y", ny, "outer*inner") ||
	       ldisjoint(&l, "y", "x");
}

static int check_cast(const char *k, const karg *a, uint32_t n, char *why, size_t cap) {
	opinfo op = op_cast;
	op.name = k;
	launch_ l = {&op, a, why, cap};
	char n1[32], n2[32];
	if (lgeneric(&l, n)) {
		return 1;
	}
	uint64_t from = a[2].value, to = a[3].value;
	if (from > 3) {
		num(n1, sizeof n1, from);
		return LREFUSE(&l, "from = %s is not a dtype code (0 f32, 1 f16, 2 bf16, 3 i32)", n1);
	}
	if (to > 3) {
		num(n1, sizeof n1, to);
		return LREFUSE(&l, "to = %s is not a dtype code (0 f32, 1 f16, 2 bf16, 3 i32)", n1);
	}
	uint32_t fs = dsize((uint8_t)from), ts = dsize((uint8_t)to);
	if (a[0].len % fs || (a[0].len && address(&a[0]) % fs)) {
		num(n1, sizeof n1, a[0].len);
		return LREFUSE(&l, "x (%s bytes) is not whole, aligned %s values", n1, dname((uint8_t)from));
	}
	if (a[1].len % ts || (a[1].len && address(&a[1]) % ts)) {
		num(n1, sizeof n1, a[1].len);
		return LREFUSE(&l, "y (%s bytes) is not whole, aligned %s values", n1, dname((uint8_t)to));
	}
	uint64_t nv = a[0].len / fs;
	if (nv == 0) {
		return LREFUSE(&l, "x has 0 values: zero-size launches are refused");
	}
	if (a[1].len / ts != nv) {
		num(n1, sizeof n1, a[1].len / ts);
		num(n2, sizeof n2, nv);
		return LREFUSE(&l, "y has %s %s values, len(x) = %s", n1, dname((uint8_t)to), n2);
	}
	return fs == ts ? linplace(&l, "y", "x") : ldisjoint(&l, "y", "x");
}

static float (*unary_fn(const char *name))(float) {
	size_t n = strcspn(name, ".");
	for (size_t i = 0; i < sizeof unary_ops / sizeof unary_ops[0]; i++) {
		if (strlen(unary_ops[i].name) == n && strncmp(unary_ops[i].name, name, n) == 0) {
			return unary_ops[i].f;
		}
	}
	return NULL;
}

/* The running program's name, for kernels shared by several programs. */
static const char *running_program;

static int k_unary(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	float (*f)(float) = unary_fn(running_program);
	for (uint32_t i = 0; i < a[0].len / 4; i++) {
		putf(b[1], i, f(getf(b[0], i)));
	}
	return 0;
}

static int k_affine(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	float k = scalar_f32(&a[2]), c = scalar_f32(&a[3]);
	for (uint32_t i = 0; i < a[0].len / 4; i++) {
		volatile float p = k * getf(b[0], i);
		putf(b[1], i, p + c);
	}
	return 0;
}

static float b_add(float x, float y) { return x + y; }
static float b_sub(float x, float y) { return x - y; }
static float b_mul(float x, float y) { return x * y; }
static float b_div(float x, float y) { return x / y; }
static float b_min(float a, float b) {
	if (a != a) return a;
	if (b != b) return b;
	if (a < b) return a;
	if (b < a) return b;
	return signbit(a) ? a : b;
}

static int k_binary(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	size_t l = strcspn(running_program, ".");
	float (*f)(float, float) = strncmp(running_program, "add", l) == 0 ? b_add
	                           : strncmp(running_program, "sub", l) == 0 ? b_sub
	                           : strncmp(running_program, "mul", l) == 0 ? b_mul
	                           : strncmp(running_program, "div", l) == 0 ? b_div
	                           : strncmp(running_program, "max", l) == 0 ? fmax_
	                                                                      : b_min;
	size_t as[4], bs[4], cs[4], sa[4] = {0}, sb[4] = {0}, pa = 1, pb = 1, k = 0;
	for (int i = 0; i < 4; i++) {
		as[i] = (size_t)a[3 + i].value, bs[i] = (size_t)a[7 + i].value;
		cs[i] = as[i] > bs[i] ? as[i] : bs[i];
	}
	for (int i = 3; i >= 0; i--) {
		if (as[i] != 1) sa[i] = pa;
		if (bs[i] != 1) sb[i] = pb;
		pa *= as[i], pb *= bs[i];
	}
	float *out = xrealloc(NULL, cs[0] * cs[1] * cs[2] * cs[3] * 4);
	for (size_t i0 = 0; i0 < cs[0]; i0++)
		for (size_t i1 = 0; i1 < cs[1]; i1++)
			for (size_t i2 = 0; i2 < cs[2]; i2++)
				for (size_t i3 = 0; i3 < cs[3]; i3++) {
					size_t ia = i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3], ib = i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3];
					out[k++] = f(getf(b[0], (uint32_t)ia), getf(b[1], (uint32_t)ib));
				}
	memcpy(b[2], out, k * 4);
	free(out);
	return 0;
}

static int k_reduce(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	size_t outer = (size_t)a[2].value, nn = (size_t)a[3].value, inner = (size_t)a[4].value;
	size_t l = strcspn(running_program, ".");
	int mode = strncmp(running_program, "reduce_max", l) == 0 ? 2 : strncmp(running_program, "reduce_mean", l) == 0 ? 1 : 0;
	float *col = xrealloc(NULL, (nn ? nn : 1) * 4);
	for (size_t o = 0; o < outer; o++)
		for (size_t i = 0; i < inner; i++) {
			for (size_t j = 0; j < nn; j++) {
				col[j] = getf(b[0], (uint32_t)((o * nn + j) * inner + i));
			}
			float v;
			if (mode == 2) {
				uint8_t tmp[4 * 256];
				(void)tmp;
				v = tree_max((const uint8_t *)col, (uint32_t)nn);
			} else {
				v = tree_sum(col, (uint32_t)nn, NULL);
				if (mode == 1) {
					v /= (float)nn;
				}
			}
			putf(b[1], (uint32_t)(o * inner + i), v);
		}
	free(col);
	return 0;
}

static int k_reduce_argmax(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	size_t outer = (size_t)a[2].value, nn = (size_t)a[3].value, inner = (size_t)a[4].value;
	for (size_t o = 0; o < outer; o++)
		for (size_t i = 0; i < inner; i++) {
			int64_t best = -1;
			float bv = 0;
			for (size_t j = 0; j < nn; j++) {
				float v = getf(b[0], (uint32_t)((o * nn + j) * inner + i));
				if (v != v) {
					continue;
				}
				if (best < 0 || v > bv) {
					best = (int64_t)j, bv = v;
				}
			}
			uint32_t r = best < 0 ? 0 : (uint32_t)best;
			memcpy(b[1] + 4 * (o * inner + i), &r, 4);
		}
	return 0;
}

static void put_float(uint8_t *out, uint64_t t, uint32_t i, float f) {
	if (t == 1) {
		uint16_t h = f32_to_f16(f);
		memcpy(out + 2 * i, &h, 2);
	} else if (t == 2) {
		uint16_t h = f32_to_bf16(f);
		memcpy(out + 2 * i, &h, 2);
	} else {
		putf(out, i, f);
	}
}

static int k_cast(karg *a, uint32_t n, uint8_t **b, char *why, size_t cap) {
	(void)n, (void)why, (void)cap;
	uint64_t from = a[2].value, to = a[3].value;
	uint32_t nv = a[0].len / dsize((uint8_t)from);
	uint8_t *out = xrealloc(NULL, a[1].len ? a[1].len : 1);
	memset(out, 0, a[1].len);
	for (uint32_t i = 0; i < nv; i++) {
		if (from == 3) {
			int32_t v;
			memcpy(&v, b[0] + 4 * i, 4);
			if (to == 3) {
				memcpy(out + 4 * i, &v, 4);
			} else if (to == 2) {
				uint16_t h = i32_to_bf16(v);
				memcpy(out + 2 * i, &h, 2);
			} else {
				put_float(out, to, i, (float)v);
			}
			continue;
		}
		float f;
		uint16_t h;
		if (from == 1 || from == 2) {
			memcpy(&h, b[0] + 2 * i, 2);
			f = from == 1 ? f16_to_f32(h) : bf16_to_f32(h);
		} else {
			f = getf(b[0], i);
		}
		if (to == 3) {
			int32_t v = f32_to_i32(f);
			memcpy(out + 4 * i, &v, 4);
			continue;
		}
		put_float(out, to, i, f);
	}
	memcpy(b[1], out, a[1].len);
	free(out);
	return 0;
}

static const program builtins[] = {
    {"noop", k_noop, NULL, NULL, 0, 0, NULL},
    {"fill", k_fill, NULL, NULL, 0, 0, NULL},
    {"copy", k_copy, NULL, NULL, 0, 0, NULL},
    {"saxpy", k_saxpy, NULL, NULL, 0, 0, NULL},
    {"relu", k_relu, NULL, NULL, 0, 0, NULL},
    {"bias", k_bias, NULL, NULL, 0, 0, NULL},
    {"matmul", k_matmul, NULL, NULL, 0, 0, NULL},
    {"argmax", k_argmax, NULL, NULL, 0, 0, NULL},
    {"mlp_forward", k_mlp_forward, NULL, NULL, 0, 0, NULL},
    {"exp", k_unary, check_unary, "TT", 1, 0, NULL},
    {"log", k_unary, check_unary, "TT", 1, 0, NULL},
    {"tanh", k_unary, check_unary, "TT", 1, 0, NULL},
    {"sigmoid", k_unary, check_unary, "TT", 1, 0, NULL},
    {"silu", k_unary, check_unary, "TT", 1, 0, NULL},
    {"sqrt", k_unary, check_unary, "TT", 1, 0, NULL},
    {"rsqrt", k_unary, check_unary, "TT", 1, 0, NULL},
    {"neg", k_unary, check_unary, "TT", 1, 0, NULL},
    {"abs", k_unary, check_unary, "TT", 1, 0, NULL},
    {"gelu_tanh", k_unary, check_unary, "TT", 1, 0, NULL},
    {"gelu_erf", k_unary, check_unary, "TT", 1, 0, NULL},
    {"affine", k_affine, check_unary, "TT--", 1, 0, NULL},
    {"add", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"sub", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"mul", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"div", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"max", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"min", k_binary, check_binary, "TTT--------", 1, 0, NULL},
    {"reduce_sum", k_reduce, check_reduce, "TT---", 1, 0, NULL},
    {"reduce_mean", k_reduce, check_reduce, "TT---", 1, 0, NULL},
    {"reduce_max", k_reduce, check_reduce, "TT---", 1, 0, NULL},
    {"reduce_argmax", k_reduce_argmax, check_reduce, "Ti---", 1, 0, NULL},
    {"softmax", k_softmax, check_softmax, "TT---", 1, 0, NULL},
    {"log_softmax", k_log_softmax, check_softmax, "TT---", 1, 0, NULL},
    {"layernorm", k_layernorm, check_norm, "TTTT---", 1, 0, NULL},
    {"rmsnorm", k_rmsnorm, check_norm, "TTT---", 1, 0, NULL},
    {"transpose", k_transpose, check_transpose, "TT--------", 1, 0, NULL},
    {"gemm", k_gemm, check_gemm, "TTT-----------", 1, 0, NULL},
    {"gemm.fast", k_gemm, check_gemm, "TTT-----------", 1, 0, NULL},
    {"gather", k_gather, check_gather, "fif--", 0, 0, NULL},
    {"conv2d", k_conv, check_conv, "ffff-----------", 0, 0, NULL},
    {"conv2d.fast", k_conv, check_conv, "ffff-----------", 0, 0, NULL},
    {"maxpool2d", k_maxpool, check_pool, "ff--------", 0, 0, NULL},
    {"avgpool2d", k_avgpool, check_pool, "ff--------", 0, 0, NULL},
    {"cast", k_cast, check_cast, "BB--", 0, 0, NULL},
};

int stagehost_emu_program(stagehost_emu *e, const char *name) {
	/* OP, or OP.f16 / OP.bf16 (then .fast where the op has it) for half storage. */
	char base[48];
	uint8_t dtype = 0;
	const char *t = strstr(name, ".f16");
	size_t tl = 4;
	if (!t) {
		t = strstr(name, ".bf16"), tl = 5;
	}
	if (strlen(name) >= sizeof base) {
		return 0;
	}
	if (t) {
		dtype = tl == 4 ? 1 : 2;
		snprintf(base, sizeof base, "%.*s%s", (int)(t - name), name, t + tl);
	} else {
		snprintf(base, sizeof base, "%s", name);
	}
	for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
		if (strcmp(builtins[i].name, base) == 0 && (dtype == 0 || builtins[i].half)) {
			e->progs = xrealloc(e->progs, (e->nprogs + 1) * sizeof *e->progs);
			e->progs[e->nprogs] = builtins[i];
			snprintf(e->progs[e->nprogs].name, sizeof e->progs[e->nprogs].name, "%s", name);
			e->progs[e->nprogs].dtype = dtype;
			add_object(e, K_PROGRAM, name, e->nprogs++);
			return 1;
		}
	}
	return 0;
}

/* One of the words of list (NULL-terminated) equal to w, as a static
 * string; NULL when none is. */
static const char *word(const char *w, const char *const *list) {
	for (; w && *list; list++) {
		if (strcmp(w, *list) == 0) {
			return *list;
		}
	}
	return NULL;
}

/* The program names a backend of the host has built in (sim's kernels
 * and op library, cuda's kernels and host programs), which a manifest
 * refuses as a vendor kernel's name. The host's tests (package manifest)
 * keep the list equal to the host's. */
static const char *const host_programs[] = {
	"abs", "abs.bf16", "abs.f16", "add", "add.bf16", "add.f16", "affine", "affine.bf16", "affine.f16",
	"argmax", "avgpool2d", "bias", "cast", "conv2d", "conv2d.fast", "copy", "div", "div.bf16",
	"div.f16", "exp", "exp.bf16", "exp.f16", "fault", "fill", "gather", "gelu_erf", "gelu_erf.bf16",
	"gelu_erf.f16", "gelu_tanh", "gelu_tanh.bf16", "gelu_tanh.f16", "gemm", "gemm.bf16",
	"gemm.bf16.fast", "gemm.f16", "gemm.f16.fast", "gemm.fast", "layernorm", "layernorm.bf16",
	"layernorm.f16", "log", "log.bf16", "log.f16", "log_softmax", "log_softmax.bf16",
	"log_softmax.f16", "matmul", "max", "max.bf16", "max.f16", "maxpool2d", "min", "min.bf16",
	"min.f16", "mlp_forward", "mul", "mul.bf16", "mul.f16", "neg", "neg.bf16", "neg.f16", "noop",
	"reduce_argmax", "reduce_argmax.bf16", "reduce_argmax.f16", "reduce_max", "reduce_max.bf16",
	"reduce_max.f16", "reduce_mean", "reduce_mean.bf16", "reduce_mean.f16", "reduce_sum",
	"reduce_sum.bf16", "reduce_sum.f16", "relu", "resident_gpu_exchange", "resident_npu_exchange",
	"rmsnorm", "rmsnorm.bf16", "rmsnorm.f16", "rsqrt", "rsqrt.bf16", "rsqrt.f16", "saxpy", "sigmoid",
	"sigmoid.bf16", "sigmoid.f16", "silu", "silu.bf16", "silu.f16", "softmax", "softmax.bf16",
	"softmax.f16", "spin", "sqrt", "sqrt.bf16", "sqrt.f16", "sub", "sub.bf16", "sub.f16", "tanh",
	"tanh.bf16", "tanh.f16", "transpose", "transpose.bf16", "transpose.f16",
	NULL};

/* The indefinite article of a scalar kind, as the host's messages say
 * it: "an" i32 and f32, "a" u32 and u64. */
static const char *article(const char *t) {
	return t[0] == 'i' || t[0] == 'f' ? "an" : "a";
}

/* A manifest's kernel name: 1 to 64 of a-z, 0-9, '_', '.' and '-'. */
static int kernel_name_ok(const char *s) {
	size_t n = strlen(s);
	if (n == 0 || n > MAX_KERNEL_NAME) {
		return 0;
	}
	for (; *s; s++) {
		if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '.' || *s == '-')) {
			return 0;
		}
	}
	return 1;
}

static void free_vdecl_names(vdecl *d, uint32_t n) {
	for (uint32_t i = 0; i < n; i++) {
		free(d->a[i].name);
	}
}

int stagehost_emu_vendor_kernel(stagehost_emu *e, const char *name, const stagehost_emu_vendor_arg *args, uint32_t nargs, stagehost_emu_kernel k,
                                char *why, uint32_t cap) {
	static const char *const kinds[] = {"buffer", "u32", "u64", "i32", "f32", NULL};
	static const char *const dtypes[] = {"f32", "f16", "bf16", "i32", "bytes", NULL};
	static const char *const dirs[] = {"in", "out", "inout", NULL};
	char none[1];
	if (!why || !cap) {
		why = none, cap = sizeof none;
	}
	why[0] = 0;
	program pr;
	vdecl d;
	memset(&pr, 0, sizeof pr);
	memset(&d, 0, sizeof d);
	if (!k) {
		snprintf(why, cap, "vendor kernel \"%s\": no kernel", name ? name : "");
		return 0;
	}
	if (!name || !kernel_name_ok(name)) {
		snprintf(why, cap, "\"%s\" is not a kernel name: 1 to %d of a-z, 0-9, '_', '.' and '-'", name ? name : "", MAX_KERNEL_NAME);
		return 0;
	}
	if (word(name, host_programs)) {
		snprintf(why, cap, "\"%s\" is a built-in program's name: a vendor kernel needs a name of its own", name);
		return 0;
	}
	for (uint32_t i = 0; i < e->nobjs; i++) {
		if (e->objs[i].kind == K_PROGRAM && e->objs[i].name && strcmp(e->objs[i].name, name) == 0) {
			snprintf(why, cap, "vendor kernel \"%s\": a program of that name is declared already", name);
			return 0;
		}
	}
	if (nargs > STAGEHOST_MAX_ARGS || (nargs && !args)) {
		snprintf(why, cap, "kernel \"%s\": %u arguments, more than a launch carries (%u)", name, nargs, STAGEHOST_MAX_ARGS);
		return 0;
	}
	snprintf(pr.name, sizeof pr.name, "%s", name);
	d.k = k;
	for (uint32_t i = 0; i < nargs; i++) {
		const stagehost_emu_vendor_arg *a = &args[i];
		const char *an = a->name ? a->name : "";
		if (!an[0]) {
			snprintf(why, cap, "kernel \"%s\": argument %u: an empty name", name, i);
			free_vdecl_names(&d, i);
			return 0;
		}
		for (uint32_t j = 0; j < i; j++) {
			if (strcmp(d.a[j].name, an) == 0) {
				snprintf(why, cap, "kernel \"%s\": argument %u: the name \"%s\" is given twice", name, i, an);
				free_vdecl_names(&d, i);
				return 0;
			}
		}
		d.a[i].name = xstrdup(an);
		if (!(d.a[i].kind = word(a->kind, kinds))) {
			snprintf(why, cap, "kernel \"%s\": argument %u (%s): unknown kind \"%s\" (want buffer, u32, u64, i32 or f32)", name, i, an,
			         a->kind ? a->kind : "");
			free_vdecl_names(&d, i + 1);
			return 0;
		}
		if (strcmp(d.a[i].kind, "buffer") != 0) {
			if (a->dtype || a->dir) {
				snprintf(why, cap, "kernel \"%s\": argument %u (%s): only a buffer argument has a dtype or a direction (this one is %s %s scalar)",
				         name, i, an, article(d.a[i].kind), d.a[i].kind);
				free_vdecl_names(&d, i + 1);
				return 0;
			}
			d.a[i].dir = "in"; /* as the host's (hw.KernelScalar) */
			continue;
		}
		if (!(d.a[i].dtype = word(a->dtype ? a->dtype : "bytes", dtypes))) {
			snprintf(why, cap, "kernel \"%s\": argument %u (%s): unknown dtype \"%s\" (want f32, f16, bf16, i32 or bytes)", name, i, an,
			         a->dtype);
			free_vdecl_names(&d, i + 1);
			return 0;
		}
		if (!(d.a[i].dir = word(a->dir, dirs))) {
			snprintf(why, cap, "kernel \"%s\": argument %u (%s): unknown direction \"%s\" (want in, out or inout)", name, i, an,
			         a->dir ? a->dir : "");
			free_vdecl_names(&d, i + 1);
			return 0;
		}
	}
	d.n = nargs;
	vdecl *kept = xrealloc(NULL, sizeof *kept);
	*kept = d;
	pr.vendor = kept;
	e->progs = xrealloc(e->progs, (e->nprogs + 1) * sizeof *e->progs);
	e->progs[e->nprogs] = pr;
	add_object(e, K_PROGRAM, name, e->nprogs++);
	return 1;
}

/* Handles. */

static void issue(stagehost_emu *e, uint32_t obj) {
	e->serial++;
	e->by_serial = xrealloc(e->by_serial, (e->serial + 1) * sizeof *e->by_serial);
	e->by_serial[e->serial] = obj + 1;
	e->objs[obj].handle = (uint64_t)e->objs[obj].kind << 56 | (uint64_t)e->tag << 32 | e->serial;
}

static stagehost_status resolve(stagehost_emu *e, stagehost_handle h, uint8_t kind, uint32_t *index) {
	if (h == 0) {
		return STAGEHOST_BAD_HANDLE;
	}
	if (((uint32_t)(h >> 32) & MAX_TAG) != e->tag) {
		return STAGEHOST_FOREIGN_HANDLE;
	}
	uint32_t serial = (uint32_t)h;
	if (serial == 0 || serial > e->serial) {
		return STAGEHOST_BAD_HANDLE;
	}
	object *o = &e->objs[e->by_serial[serial] - 1];
	if (o->handle != h || o->kind != kind) {
		return STAGEHOST_BAD_HANDLE;
	}
	if (kind == K_BUFFER && e->bufs[o->index].freed) {
		return STAGEHOST_STALE_HANDLE;
	}
	*index = o->index;
	return STAGEHOST_OK;
}

/* Device work. */

static void record_failure(char ***list, uint32_t *n, const char *msg) {
	*list = xrealloc(*list, (*n + 1) * sizeof **list);
	(*list)[(*n)++] = xstrdup(msg);
}

static void retire(stagehost_emu *e, stream *s) {
	command c = s->q[s->head];
	s->head = (s->head + 1) % s->cap;
	s->count--;
	if (!c.launch) {
		memcpy(e->bufs[c.buf].mem + c.off, c.data, c.len);
		free(c.data);
		return;
	}
	const program *p = &e->progs[c.prog];
	uint8_t *bufs[STAGEHOST_MAX_ARGS] = {0};
	karg ka[STAGEHOST_MAX_ARGS];
	for (uint32_t i = 0; i < c.nargs; i++) {
		ka[i] = c.args[i];
		if (!c.args[i].is_buf) {
			continue;
		}
		const uint8_t *src = e->bufs[c.args[i].buf].mem + c.args[i].off;
		if (c.args[i].dtype == 1 || c.args[i].dtype == 2) {
			/* Half values, converted to float32 for the kernel. */
			uint32_t nv = c.args[i].len / 2;
			bufs[i] = xrealloc(NULL, nv ? 4 * nv : 4);
			for (uint32_t j = 0; j < nv; j++) {
				uint16_t h;
				memcpy(&h, src + 2 * j, 2);
				putf(bufs[i], j, c.args[i].dtype == 1 ? f16_to_f32(h) : bf16_to_f32(h));
			}
			ka[i].len = 4 * nv;
		} else {
			bufs[i] = xrealloc(NULL, c.args[i].len ? c.args[i].len : 1);
			if (p->vendor && strcmp(p->vendor->a[i].dir, "out") == 0) {
				memset(bufs[i], 0, c.args[i].len); /* an out range starts zeroed, as on the host */
			} else {
				memcpy(bufs[i], src, c.args[i].len);
			}
		}
	}
	char why[1024];
	running_program = p->name;
	int failed;
	if (p->vendor) {
		stagehost_emu_arg va[STAGEHOST_MAX_ARGS];
		for (uint32_t i = 0; i < c.nargs; i++) {
			va[i] = (stagehost_emu_arg){c.args[i].is_buf ? bufs[i] : NULL, ka[i].len, ka[i].value};
		}
		why[0] = 0;
		failed = p->vendor->k(va, c.nargs, why, sizeof why);
	} else {
		failed = p->run(ka, c.nargs, bufs, why, sizeof why);
	}
	if (failed) {
		char msg[1400];
		snprintf(msg, sizeof msg, "stream \"%s\": command %llu: kernel \"%s\": %s", s->name, (unsigned long long)c.seq, p->name, why);
		record_failure(&s->failures, &s->nfail, msg);
		fprintf(stderr, "emu: %s\n", msg);
	} else {
		/* Write back the ranges the kernel changed, in argument order (in
		 * their storage type): an input's copy is unchanged, so an output
		 * that is exactly an input keeps the kernel's result. */
		for (uint32_t i = 0; i < c.nargs; i++) {
			if (!bufs[i]) {
				continue;
			}
			uint8_t *dst = e->bufs[c.args[i].buf].mem + c.args[i].off;
			if (p->vendor) {
				/* A vendor kernel's copies, as the host's on sim (ABI.md
				 * §3.6): every out and inout range back, in argument
				 * order; an in range never. */
				if (strcmp(p->vendor->a[i].dir, "in") != 0) {
					memcpy(dst, bufs[i], c.args[i].len);
				}
				continue;
			}
			uint8_t *enc = bufs[i];
			if (c.args[i].dtype == 1 || c.args[i].dtype == 2) {
				enc = xrealloc(NULL, c.args[i].len ? c.args[i].len : 1);
				for (uint32_t j = 0; j < c.args[i].len / 2; j++) {
					uint16_t h = c.args[i].dtype == 1 ? f32_to_f16(getf(bufs[i], j)) : f32_to_bf16(getf(bufs[i], j));
					memcpy(enc + 2 * j, &h, 2);
				}
			}
			if (memcmp(dst, enc, c.args[i].len) != 0) {
				memcpy(dst, enc, c.args[i].len);
			}
			if (enc != bufs[i]) {
				free(enc);
			}
		}
	}
	for (uint32_t i = 0; i < c.nargs; i++) {
		free(bufs[i]);
	}
}

static void drain(stagehost_emu *e, stream *s) {
	while (s->count) {
		retire(e, s);
	}
}

static void enqueue(stagehost_emu *e, stream *s, command c) {
	if (s->count >= QUEUE_DEPTH) {
		retire(e, s);
	}
	if (s->count == s->cap) {
		uint32_t ncap = s->cap ? 2 * s->cap : 16;
		command *q = xrealloc(NULL, ncap * sizeof *q);
		for (uint32_t i = 0; i < s->count; i++) {
			q[i] = s->q[(s->head + i) % s->cap];
		}
		free(s->q);
		s->q = q, s->head = 0, s->cap = ncap;
	}
	c.seq = ++s->seq;
	s->q[(s->head + s->count) % s->cap] = c;
	s->count++;
}

/* Host functions. */

stagehost_status stagehost_input_size(uint32_t *out_len) {
	stagehost_emu *e = need("input_size");
	if (!out_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	*out_len = e->input_len;
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_input_read(uint32_t offset, void *dst, uint32_t dst_len, uint32_t *out_n) {
	stagehost_emu *e = need("input_read");
	if ((!dst && dst_len) || !out_n) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	if (offset > e->input_len) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "offset %u is beyond the input's %u bytes", offset, e->input_len));
	}
	uint32_t n = e->input_len - offset < dst_len ? e->input_len - offset : dst_len;
	if (n) {
		memcpy(dst, e->input + offset, n);
	}
	*out_n = n;
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_output_write(const void *src, uint32_t src_len) {
	stagehost_emu *e = need("output_write");
	if (!src && src_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	if ((uint64_t)e->output_len + src_len > e->out_limit) {
		return note(e, fail(e, STAGEHOST_OUTPUT_TOO_LARGE,
		                    "%u more bytes would take the output past its limit of %u bytes: output larger than its limit", src_len,
		                    e->out_limit));
	}
	e->output = xrealloc(e->output, e->output_len + src_len);
	if (src_len) {
		memcpy(e->output + e->output_len, src, src_len);
	}
	e->output_len += src_len;
	return note(e, STAGEHOST_OK);
}

static stagehost_status string_out(const char *s, char *dst, uint32_t cap, uint32_t *out_len) {
	uint32_t n = (uint32_t)strlen(s);
	if (!out_len || (!dst && cap)) {
		return STAGEHOST_OUT_OF_BOUNDS;
	}
	*out_len = n;
	if (cap < n) {
		return STAGEHOST_OUT_OF_BOUNDS;
	}
	memcpy(dst, s, n);
	return STAGEHOST_OK;
}

stagehost_status stagehost_entry_name(char *dst, uint32_t dst_cap, uint32_t *out_len) {
	stagehost_emu *e = need("entry_name");
	return note(e, string_out(e->entry, dst, dst_cap, out_len));
}

stagehost_status stagehost_last_error(char *dst, uint32_t dst_cap, uint32_t *out_len) {
	stagehost_emu *e = need("last_error");
	return string_out(e->last_err, dst, dst_cap, out_len); /* never changes the last error */
}

stagehost_status stagehost_error_set(const char *msg, uint32_t msg_len) {
	stagehost_emu *e = need("error_set");
	if (!msg && msg_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	if (msg_len > STAGEHOST_MAX_ERROR_MESSAGE) {
		msg_len = STAGEHOST_MAX_ERROR_MESSAGE;
	}
	memcpy(e->err_msg, msg, msg_len);
	e->err_msg[msg_len] = 0;
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_log(int32_t level, const char *msg, uint32_t msg_len) {
	stagehost_emu *e = need("log");
	if (!msg && msg_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	if (level < 0 || level > 3) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "log level %d is not one of 0 to 3", level));
	}
	if (getenv("STAGEHOST_EMU_LOG")) {
		fprintf(stderr, "emu log %d: %.*s\n", level, (int)msg_len, msg);
	}
	return note(e, STAGEHOST_OK);
}

static stagehost_status lookup(const char *op, uint8_t kind, const char *name, uint32_t len, stagehost_handle *out) {
	stagehost_emu *e = need(op);
	if ((!name && len) || !out) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	for (uint32_t i = 0; i < e->nobjs; i++) {
		object *o = &e->objs[i];
		if (o->kind == kind && o->name && strlen(o->name) == len && memcmp(o->name, name, len) == 0) {
			if (!o->handle) {
				issue(e, i);
			}
			*out = o->handle;
			return note(e, STAGEHOST_OK);
		}
	}
	static const char *why[] = {"", "declares no stream of that name", "declares no buffer of that name", "may use no program of that name"};
	static const char *kinds[] = {"", "stream", "buffer", "program"};
	return note(e, fail(e, STAGEHOST_NOT_FOUND, "%s \"%.*s\" not found: the session %s", kinds[kind], (int)len, name, why[kind]));
}

stagehost_status stagehost_stream_get(const char *name, uint32_t name_len, stagehost_handle *out_handle) {
	return lookup("stream_get", K_STREAM, name, name_len, out_handle);
}
stagehost_status stagehost_buffer_get(const char *name, uint32_t name_len, stagehost_handle *out_handle) {
	return lookup("buffer_get", K_BUFFER, name, name_len, out_handle);
}
stagehost_status stagehost_program_get(const char *name, uint32_t name_len, stagehost_handle *out_handle) {
	return lookup("program_get", K_PROGRAM, name, name_len, out_handle);
}

static stagehost_status alloc(stagehost_emu *e, uint32_t size, stagehost_handle *out, uint32_t *bufidx) {
	if (size == 0) {
		return fail(e, STAGEHOST_INVALID_ARGUMENT, "buffer size 0");
	}
	if (e->budget && e->used + size > e->budget) {
		return fail(e, STAGEHOST_OUT_OF_BUDGET, "budget \"emu\": %u bytes requested, %llu of %llu in use", size,
		            (unsigned long long)e->used, (unsigned long long)e->budget);
	}
	e->used += size;
	uint32_t b = add_buffer(e, size, 1);
	uint32_t o = add_object(e, K_BUFFER, NULL, b);
	issue(e, o);
	*out = e->objs[o].handle;
	if (bufidx) {
		*bufidx = b;
	}
	return STAGEHOST_OK;
}

stagehost_status stagehost_buffer_alloc(uint32_t size, stagehost_handle *out_handle) {
	stagehost_emu *e = need("buffer_alloc");
	if (!out_handle) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	return note(e, alloc(e, size, out_handle, NULL));
}

stagehost_status stagehost_buffer_alloc_named(const char *name, uint32_t name_len, uint32_t size, stagehost_handle *out_handle) {
	stagehost_emu *e = need("buffer_alloc_named");
	if ((!name && name_len) || !out_handle) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	if (name_len == 0 || name_len > 256) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "a buffer name of %u bytes: 1 to 256", name_len));
	}
	for (uint32_t i = 0; i < e->nobjs; i++) {
		object *o = &e->objs[i];
		buffer *b = o->kind == K_BUFFER ? &e->bufs[o->index] : NULL;
		if (b && b->named && !b->freed && strlen(b->named) == name_len && memcmp(b->named, name, name_len) == 0) {
			if (b->size != size) {
				return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "buffer \"%.*s\" has %u bytes, not %u", (int)name_len, name, b->size, size));
			}
			*out_handle = o->handle;
			return note(e, STAGEHOST_OK);
		}
	}
	uint32_t b;
	stagehost_status st = alloc(e, size, out_handle, &b);
	if (st == STAGEHOST_OK) {
		e->bufs[b].named = xrealloc(NULL, name_len + 1);
		memcpy(e->bufs[b].named, name, name_len);
		e->bufs[b].named[name_len] = 0;
	}
	return note(e, st);
}

stagehost_status stagehost_buffer_free(stagehost_handle buffer) {
	stagehost_emu *e = need("buffer_free");
	uint32_t b;
	stagehost_status st = resolve(e, buffer, K_BUFFER, &b);
	if (st != STAGEHOST_OK) {
		return note(e, st);
	}
	if (e->bufs[b].weights) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "buffer_free: buffer is the read-only weights \"%s\", which cannot be freed",
		                    e->bufs[b].weights));
	}
	if (!e->bufs[b].allocated) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "a declared buffer cannot be freed"));
	}
	/* The handle is stale at once; the memory stays charged until the
	 * run's fence proves the drain. */
	e->bufs[b].freed = 1;
	e->freeing += e->bufs[b].size;
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_weights_get(const char *name, uint32_t name_len, stagehost_handle *out_handle) {
	stagehost_emu *e = need("weights_get");
	if ((!name && name_len) || !out_handle) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	for (uint32_t i = 0; i < e->nweights; i++) {
		weights *w = &e->weights[i];
		if (strlen(w->name) == name_len && memcmp(w->name, name, name_len) == 0) {
			if (!e->objs[w->obj].handle) {
				issue(e, w->obj);
			}
			*out_handle = e->objs[w->obj].handle;
			return note(e, STAGEHOST_OK);
		}
	}
	return note(e, fail(e, STAGEHOST_NOT_FOUND, "weights \"%.*s\" not found: the session lists no weights of that name", (int)name_len, name));
}

static void put64(uint8_t *p, uint64_t v) {
	for (int i = 0; i < 8; i++) {
		p[i] = (uint8_t)(v >> 8 * i);
	}
}

stagehost_status stagehost_tensor_get(const char *name, uint32_t name_len, stagehost_tensor_record *out) {
	stagehost_emu *e = need("tensor_get");
	if ((!name && name_len) || !out) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	const char *slash = name_len ? memchr(name, '/', name_len) : NULL;
	if (!slash) {
		return note(e, fail(e, STAGEHOST_NOT_FOUND, "tensor \"%.*s\" not found: a tensor is named \"<weights>/<tensor>\"", (int)name_len, name));
	}
	uint32_t wl = (uint32_t)(slash - name), tl = name_len - wl - 1;
	for (uint32_t i = 0; i < e->nweights; i++) {
		weights *w = &e->weights[i];
		if (strlen(w->name) != wl || memcmp(w->name, name, wl) != 0) {
			continue;
		}
		for (uint32_t j = 0; j < w->ntensors; j++) {
			wtensor *t = &w->tensors[j];
			if (strlen(t->name) != tl || memcmp(t->name, slash + 1, tl) != 0) {
				continue;
			}
			if (!e->objs[w->obj].handle) {
				issue(e, w->obj);
			}
			uint8_t rec[STAGEHOST_TENSOR_RECORD_SIZE] = {0};
			put64(rec, e->objs[w->obj].handle);
			put64(rec + 8, t->begin);
			put64(rec + 16, t->end - t->begin);
			put64(rec + 24, (uint64_t)t->rank << 32 | t->code);
			for (uint32_t d = 0; d < t->rank; d++) {
				put64(rec + 32 + 8 * d, t->dims[d]);
			}
			memcpy(out, rec, sizeof rec);
			return note(e, STAGEHOST_OK);
		}
		return note(e, fail(e, STAGEHOST_NOT_FOUND, "tensor \"%.*s\" not found: the weights \"%.*s\" have no tensor \"%.*s\"", (int)name_len,
		                    name, (int)wl, name, (int)tl, slash + 1));
	}
	return note(e, fail(e, STAGEHOST_NOT_FOUND, "tensor \"%.*s\" not found: the session lists no weights \"%.*s\"", (int)name_len, name,
	                    (int)wl, name));
}

stagehost_status stagehost_buffer_size(stagehost_handle buffer, uint32_t *out_size) {
	stagehost_emu *e = need("buffer_size");
	uint32_t b;
	if (!out_size) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	stagehost_status st = resolve(e, buffer, K_BUFFER, &b);
	if (st == STAGEHOST_OK) {
		*out_size = e->bufs[b].size;
	}
	return note(e, st);
}

/* The host's refusal of a stream_write or stream_read range [off, off+n)
 * outside buffer b (stages, checkRange). An argument record's range is
 * refused with its number where records are read. */
static stagehost_status outside(stagehost_emu *e, uint32_t off, uint64_t n, uint32_t b) {
	return fail(e, STAGEHOST_INVALID_ARGUMENT, "range [%u,+%llu) outside a buffer of %u bytes", off, (unsigned long long)n, e->bufs[b].size);
}

/* The host's refusal of more than STAGEHOST_MAX_ARGS argument records
 * (stages, decodeArgs; in a batch too, without the command's number). */
static stagehost_status too_many_args(stagehost_emu *e, uint32_t n) {
	return fail(e, STAGEHOST_INVALID_ARGUMENT, "%u arguments, at most %u", n, STAGEHOST_MAX_ARGS);
}

static stagehost_status transfer(stagehost_emu *e, stagehost_handle sh, stagehost_handle bh, uint32_t off, uint32_t n, uint32_t *s,
                                 uint32_t *b) {
	stagehost_status st = resolve(e, sh, K_STREAM, s);
	if (st == STAGEHOST_OK) {
		st = resolve(e, bh, K_BUFFER, b);
	}
	if (st == STAGEHOST_OK && (uint64_t)off + n > e->bufs[*b].size) {
		st = outside(e, off, n, *b);
	}
	return st;
}

stagehost_status stagehost_stream_write(stagehost_handle stream_h, stagehost_handle buffer, uint32_t offset, const void *src,
                                        uint32_t src_len) {
	stagehost_emu *e = need("stream_write");
	uint32_t s, b;
	if (!src && src_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	stagehost_status st = transfer(e, stream_h, buffer, offset, src_len, &s, &b);
	if ((st == STAGEHOST_OK || st == STAGEHOST_INVALID_ARGUMENT) && e->bufs[b].weights) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "stream_write: buffer is the read-only weights \"%s\", which cannot be written",
		                    e->bufs[b].weights));
	}
	if (st == STAGEHOST_OK) {
		command c = {0};
		c.buf = b, c.off = offset, c.len = src_len;
		c.data = xrealloc(NULL, src_len);
		if (src_len) {
			memcpy(c.data, src, src_len);
		}
		enqueue(e, &e->streams[s], c);
	}
	return note(e, st);
}

stagehost_status stagehost_stream_read(stagehost_handle stream_h, stagehost_handle buffer, uint32_t offset, void *dst, uint32_t dst_len) {
	stagehost_emu *e = need("stream_read");
	uint32_t s, b;
	if (!dst && dst_len) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	stagehost_status st = transfer(e, stream_h, buffer, offset, dst_len, &s, &b);
	if (st == STAGEHOST_OK) {
		drain(e, &e->streams[s]); /* failures are left for stream_sync */
		e->streams[s].seq++;       /* a command of the stream, as on the host */
		if (dst_len) {
			memcpy(dst, e->bufs[b].mem + offset, dst_len);
		}
	}
	return note(e, st);
}

/* The argument directions of the kernels, as hw/sim and the op library
 * (hw/internal/ops) describe them: i in, o out, x inout, one a argument;
 * OP.f16, OP.bf16 and OP.fast are OP's. noop, variadic, has none (so it
 * takes no weights, as on the host). */
static const struct {
	const char *name, *dirs;
} kernel_dirs[] = {
    {"fill", "oi"}, {"copy", "oi"}, {"saxpy", "iix"}, {"matmul", "iioiii"}, {"bias", "xiii"}, {"relu", "x"}, {"argmax", "io"},
    {"mlp_forward", "iiiiiooiii"}, {"exp", "io"}, {"log", "io"}, {"tanh", "io"}, {"sigmoid", "io"}, {"silu", "io"}, {"sqrt", "io"},
    {"rsqrt", "io"}, {"neg", "io"}, {"abs", "io"}, {"gelu_tanh", "io"}, {"gelu_erf", "io"}, {"affine", "ioii"},
    {"add", "iioiiiiiiii"}, {"sub", "iioiiiiiiii"}, {"mul", "iioiiiiiiii"}, {"div", "iioiiiiiiii"}, {"max", "iioiiiiiiii"},
    {"min", "iioiiiiiiii"}, {"reduce_sum", "ioiii"}, {"reduce_mean", "ioiii"}, {"reduce_max", "ioiii"}, {"reduce_argmax", "ioiii"},
    {"softmax", "ioiii"}, {"log_softmax", "ioiii"}, {"layernorm", "iiioiii"}, {"rmsnorm", "iioiii"}, {"transpose", "ioiiiiiiii"},
    {"gemm", "iixiiiiiiiiiii"}, {"gather", "iioii"}, {"conv2d", "iiioiiiiiiiiiii"}, {"maxpool2d", "ioiiiiiiii"},
    {"avgpool2d", "ioiiiiiiii"}, {"cast", "ioii"},
};

/* arg_dir is the direction of argument i of program p ("" when its kernel
 * has no description of it: noop, an argument past the described ones);
 * a vendor kernel's is its declaration's ("in" for a scalar). */
static const char *arg_dir(const program *p, uint32_t i) {
	if (p->vendor) {
		return i < p->vendor->n ? p->vendor->a[i].dir : "";
	}
	char base[48];
	size_t n = strcspn(p->name, ".");
	snprintf(base, sizeof base, "%.*s", (int)n, p->name);
	for (size_t k = 0; k < sizeof kernel_dirs / sizeof kernel_dirs[0]; k++) {
		if (strcmp(kernel_dirs[k].name, base) == 0) {
			if (i >= strlen(kernel_dirs[k].dirs)) {
				return "";
			}
			char d = kernel_dirs[k].dirs[i];
			return d == 'i' ? "in" : d == 'o' ? "out" : "inout";
		}
	}
	return "";
}

static stagehost_status parse_args(stagehost_emu *e, const program *pr, const stagehost_arg *recs, uint32_t n, karg *out) {
	if (n > STAGEHOST_MAX_ARGS) {
		return too_many_args(e, n);
	}
	if (n && !recs) {
		return STAGEHOST_OUT_OF_BOUNDS;
	}
	for (uint32_t i = 0; i < n; i++) {
		const stagehost_arg *r = &recs[i];
		memset(&out[i], 0, sizeof out[i]);
		if (r->reserved) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "argument %u: reserved field is not zero", i);
		}
		if (r->kind == STAGEHOST_ARG_SCALAR) {
			out[i].value = r->value;
			continue;
		}
		if (r->kind != STAGEHOST_ARG_BUFFER) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "argument %u: unknown kind %u", i, r->kind);
		}
		uint32_t b;
		stagehost_status st = resolve(e, r->value, K_BUFFER, &b);
		if (st != STAGEHOST_OK) {
			return st;
		}
		if (e->bufs[b].weights) {
			const char *dir = arg_dir(pr, i);
			if (strcmp(dir, "in") != 0) {
				if (!dir[0]) {
					return fail(e, STAGEHOST_INVALID_ARGUMENT,
					            "%s: argument %u is the read-only weights \"%s\", but the kernel's argument %u is not described as read only",
					            pr->name, i, e->bufs[b].weights, i);
				}
				return fail(e, STAGEHOST_INVALID_ARGUMENT,
				            "%s: argument %u is the read-only weights \"%s\", but the kernel's argument %u is written (direction %s)", pr->name, i,
				            e->bufs[b].weights, i, dir);
			}
		}
		uint64_t size = e->bufs[b].size, len = r->length;
		if (r->length == STAGEHOST_TO_END) {
			if (r->offset > size) {
				return fail(e, STAGEHOST_INVALID_ARGUMENT, "argument %u: offset %u beyond a buffer of %llu bytes", i, r->offset,
				            (unsigned long long)size);
			}
			len = size - r->offset;
		}
		if (r->offset + len > size) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "argument %u: range [%u,+%llu) outside a buffer of %llu bytes", i, r->offset,
			            (unsigned long long)len, (unsigned long long)size);
		}
		out[i] = (karg){1, b, r->offset, (uint32_t)len, 0, 0};
	}
	return STAGEHOST_OK;
}

static stagehost_status launch(stagehost_emu *e, stagehost_handle ph, const stagehost_arg *recs, uint32_t n, command *c, int index) {
	uint32_t p;
	stagehost_status st = resolve(e, ph, K_PROGRAM, &p);
	if (st != STAGEHOST_OK) {
		return st;
	}
	if (e->progs[p].vendor) {
		char pre[32] = "";
		if (index >= 0) {
			snprintf(pre, sizeof pre, "command %d: ", index);
		}
		return fail(e, STAGEHOST_INVALID_ARGUMENT,
		            "%sprogram \"%s\" is a vendor kernel: launch it with stream_launch, which gives its grid, block and shared memory (ABI.md §3.5)",
		            pre, e->progs[p].name);
	}
	memset(c, 0, sizeof *c);
	c->launch = 1, c->prog = p, c->nargs = n;
	if ((st = parse_args(e, &e->progs[p], recs, n, c->args)) != STAGEHOST_OK) {
		return st;
	}
	const program *pr = &e->progs[p];
	for (uint32_t i = 0; pr->btypes && i < n && pr->btypes[i]; i++) {
		char bt = pr->btypes[i];
		c->args[i].dtype = bt == 'T' ? pr->dtype : bt == 'i' ? 3 : bt == 'B' ? 4 : 0;
	}
	char why[1024];
	if (e->progs[p].check && e->progs[p].check(e->progs[p].name, c->args, n, why, sizeof why)) {
		if (index >= 0) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "command %d: %s", index, why);
		}
		return fail(e, STAGEHOST_INVALID_ARGUMENT, "%s", why);
	}
	return STAGEHOST_OK;
}

stagehost_status stagehost_stream_submit(stagehost_handle stream_h, stagehost_handle program, const stagehost_arg *args, uint32_t args_count) {
	stagehost_emu *e = need("stream_submit");
	uint32_t s;
	command c;
	stagehost_status st = resolve(e, stream_h, K_STREAM, &s);
	if (st == STAGEHOST_OK && (st = launch(e, program, args, args_count, &c, -1)) == STAGEHOST_OK) {
		enqueue(e, &e->streams[s], c);
	}
	return note(e, st);
}

/* The sim devices' fixed launch limits (abi/ABI.md §3.5), as the Go
 * emulator's LaunchLimits. */
static const uint32_t max_block[3] = {1024, 1024, 64}, max_grid[3] = {2147483647u, 65535, 65535};
#define MAX_THREADS_PER_BLOCK 1024u
#define MAX_SHARED_BYTES (48u << 10)

/* check_shape: the launch shape against the fixed limits, in the host's
 * order and words (hw.LaunchLimits.Check). */
static stagehost_status check_shape(stagehost_emu *e, const char *name, const uint32_t *g, const uint32_t *b, uint32_t shared) {
	uint64_t threads = 1;
	for (int i = 0; i < 3; i++) {
		if (g[i] == 0 || b[i] == 0) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT,
			            "kernel \"%s\": launch shape: grid [%u %u %u], block [%u %u %u]: every dimension is at least 1", name, g[0], g[1], g[2],
			            b[0], b[1], b[2]);
		}
		if (b[i] > max_block[i]) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": launch shape: block.%c = %u, over the device's limit of %u", name,
			            "xyz"[i], b[i], max_block[i]);
		}
		if (g[i] > max_grid[i]) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": launch shape: grid.%c = %u, over the device's limit of %u", name,
			            "xyz"[i], g[i], max_grid[i]);
		}
		threads *= b[i];
	}
	if (threads > MAX_THREADS_PER_BLOCK) {
		return fail(e, STAGEHOST_INVALID_ARGUMENT,
		            "kernel \"%s\": launch shape: block [%u %u %u] is %llu threads, over the device's limit of %u per block", name, b[0], b[1],
		            b[2], (unsigned long long)threads, MAX_THREADS_PER_BLOCK);
	}
	if (shared > MAX_SHARED_BYTES) {
		return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": launch shape: %u bytes of shared memory, over the device's limit of %u", name,
		            shared, MAX_SHARED_BYTES);
	}
	return STAGEHOST_OK;
}

static uint32_t dtype_size(const char *t) {
	return strcmp(t, "f32") == 0 || strcmp(t, "i32") == 0 ? 4 : strcmp(t, "f16") == 0 || strcmp(t, "bf16") == 0 ? 2 : 1;
}

/* check_signature: a launch's arguments against a vendor kernel's
 * declaration, in the host's words (stages, checkSignature): the count,
 * each one's kind, a buffer's length against its dtype, a 32-bit
 * scalar's value. */
static stagehost_status check_signature(stagehost_emu *e, const program *pr, const karg *a, uint32_t n) {
	if (n != pr->vendor->n) {
		return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\" takes %u arguments, got %u", pr->name, pr->vendor->n, n);
	}
	for (uint32_t i = 0; i < n; i++) {
		const char *an = pr->vendor->a[i].name, *kind = pr->vendor->a[i].kind;
		int buf = strcmp(kind, "buffer") == 0;
		if (buf && !a[i].is_buf) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": argument %u (%s) is a buffer (%s, %s), got a scalar", pr->name, i, an,
			            pr->vendor->a[i].dtype, pr->vendor->a[i].dir);
		}
		if (!buf && a[i].is_buf) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": argument %u (%s) is %s %s scalar, got a buffer", pr->name, i, an, article(kind), kind);
		}
		if (buf && a[i].len % dtype_size(pr->vendor->a[i].dtype) != 0) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": argument %u (%s): %u bytes is not a whole number of %s values", pr->name,
			            i, an, a[i].len, pr->vendor->a[i].dtype);
		}
		if (!buf && strcmp(kind, "u64") != 0 && a[i].value >> 32 != 0) {
			return fail(e, STAGEHOST_INVALID_ARGUMENT, "kernel \"%s\": argument %u (%s): %#llx does not fit %s %s", pr->name, i, an,
			            (unsigned long long)a[i].value, article(kind), kind);
		}
	}
	return STAGEHOST_OK;
}

/* stream_launch (revision 4), in the host's order: the stream, the
 * program, the grid and block records, a built-in program refused, the
 * shape, the argument records, the arguments against the declaration;
 * nothing is enqueued unless all pass. */
stagehost_status stagehost_stream_launch(stagehost_handle stream_h, stagehost_handle program_h, const uint32_t *grid, const uint32_t *block,
                                         uint32_t shared_bytes, const stagehost_arg *args, uint32_t args_count) {
	stagehost_emu *e = need("stream_launch");
	uint32_t s, p;
	command c;
	stagehost_status st = resolve(e, stream_h, K_STREAM, &s);
	if (st == STAGEHOST_OK) {
		st = resolve(e, program_h, K_PROGRAM, &p);
	}
	if (st == STAGEHOST_OK && (!grid || !block)) {
		st = STAGEHOST_OUT_OF_BOUNDS;
	}
	if (st != STAGEHOST_OK) {
		return note(e, st);
	}
	const program *pr = &e->progs[p];
	if (!pr->vendor) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "program \"%s\" is built in: stream_launch launches vendor kernels; use stream_submit",
		                    pr->name));
	}
	if ((st = check_shape(e, pr->name, grid, block, shared_bytes)) != STAGEHOST_OK) {
		return note(e, st);
	}
	memset(&c, 0, sizeof c);
	c.launch = 1, c.prog = p, c.nargs = args_count;
	if ((st = parse_args(e, pr, args, args_count, c.args)) != STAGEHOST_OK || (st = check_signature(e, pr, c.args, args_count)) != STAGEHOST_OK) {
		return note(e, st);
	}
	enqueue(e, &e->streams[s], c);
	return note(e, STAGEHOST_OK);
}

uint32_t stagehost_emu_args_ptr(const stagehost_arg *args, uint32_t count) {
	(void)count;
	if (nbatch_args == STAGEHOST_MAX_BATCH) {
		nbatch_args = 0;
	}
	batch_args[nbatch_args++] = args;
	return nbatch_args; /* a token: index + 1 */
}

stagehost_status stagehost_stream_submit_batch(stagehost_handle stream_h, const stagehost_command *cmds, uint32_t cmds_count) {
	stagehost_emu *e = need("stream_submit_batch");
	uint32_t s, ntok = nbatch_args;
	nbatch_args = 0;
	stagehost_status st = resolve(e, stream_h, K_STREAM, &s);
	if (st != STAGEHOST_OK) {
		return note(e, st);
	}
	if (cmds_count > STAGEHOST_MAX_BATCH) {
		return note(e, fail(e, STAGEHOST_INVALID_ARGUMENT, "a batch of %u commands, at most %u", cmds_count, STAGEHOST_MAX_BATCH));
	}
	if (cmds_count && !cmds) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	command *cs = xrealloc(NULL, (cmds_count ? cmds_count : 1) * sizeof *cs);
	for (uint32_t i = 0; i < cmds_count; i++) {
		uint32_t tok = cmds[i].args_ptr;
		const stagehost_arg *recs = tok >= 1 && tok <= ntok ? batch_args[tok - 1] : NULL;
		uint32_t vp;
		if (resolve(e, cmds[i].program, K_PROGRAM, &vp) == STAGEHOST_OK && e->progs[vp].vendor) {
			st = launch(e, cmds[i].program, NULL, 0, &cs[i], (int)i); /* the vendor kernel's refusal */
		} else if (cmds[i].args_count > STAGEHOST_MAX_ARGS) {
			uint32_t p;
			st = resolve(e, cmds[i].program, K_PROGRAM, &p);
			st = st != STAGEHOST_OK ? st : too_many_args(e, cmds[i].args_count);
		} else if (cmds[i].args_count && !recs) {
			uint32_t p;
			st = resolve(e, cmds[i].program, K_PROGRAM, &p);
			st = st != STAGEHOST_OK ? st : STAGEHOST_OUT_OF_BOUNDS;
		} else {
			st = launch(e, cmds[i].program, recs, cmds[i].args_count, &cs[i], (int)i);
		}
		if (st != STAGEHOST_OK) {
			free(cs);
			return note(e, st);
		}
	}
	for (uint32_t i = 0; i < cmds_count; i++) {
		enqueue(e, &e->streams[s], cs[i]);
	}
	free(cs);
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_stream_sync(stagehost_handle stream_h) {
	stagehost_emu *e = need("stream_sync");
	uint32_t si;
	stagehost_status st = resolve(e, stream_h, K_STREAM, &si);
	if (st != STAGEHOST_OK) {
		return note(e, st);
	}
	stream *s = &e->streams[si];
	drain(e, s);
	if (s->nfail) {
		/* Recorded: the run fails even if the guest ignores it. */
		char *why = s->failures[0];
		memmove(s->failures, s->failures + 1, (s->nfail - 1) * sizeof *s->failures);
		s->nfail--;
		record_failure(&e->failures, &e->nfail, why);
		fail(e, STAGEHOST_FAULT, "%s", why);
		free(why);
		return note(e, STAGEHOST_FAULT);
	}
	return note(e, STAGEHOST_OK);
}

stagehost_status stagehost_stream_idle(stagehost_handle stream_h, uint32_t *out_idle) {
	stagehost_emu *e = need("stream_idle");
	uint32_t s;
	if (!out_idle) {
		return note(e, STAGEHOST_OUT_OF_BOUNDS);
	}
	stagehost_status st = resolve(e, stream_h, K_STREAM, &s);
	if (st == STAGEHOST_OK) {
		*out_idle = e->streams[s].count == 0;
		if (e->streams[s].count) {
			retire(e, &e->streams[s]); /* the device makes progress meanwhile */
		}
	}
	return note(e, st);
}

/* Runs. */

stagehost_emu_result stagehost_emu_run(stagehost_emu *e, const char *entry, const void *input, uint32_t input_len, int32_t (*stage)(void)) {
	stagehost_emu_result r = {0};
	if (e->running || cur) {
		r.outcome = STAGEHOST_EMU_BUSY;
		r.message = "emu: run called while an emulator is running a stage: BUSY";
		return r;
	}
	if (e->lost) {
		r.outcome = STAGEHOST_EMU_QUARANTINED;
		r.message = e->lost;
		return r;
	}
	e->running = 1;
	cur = e;
	e->entry = entry ? entry : "main";
	e->input = input, e->input_len = input_len;
	e->output_len = 0;
	e->err_msg[0] = e->last_err[0] = e->why[0] = 0;
	for (uint32_t i = 0; i < e->nfail; i++) {
		free(e->failures[i]);
	}
	e->nfail = 0;

	int32_t code = stage ? stage() : 0;
	char reason[512] = "";
	int fence_fault = 0;
	if (e->fence) {
		int32_t f = e->fence();
		if (f == STAGEHOST_FAULT) {
			fence_fault = 1;
		} else if (f != STAGEHOST_OK) {
			snprintf(reason, sizeof reason, "fence returned %d", f);
		}
	} else {
		for (uint32_t i = 0; i < e->nstreams; i++) { /* the built-in fence */
			stream *s = &e->streams[i];
			drain(e, s);
			for (uint32_t j = 0; j < s->nfail; j++) {
				record_failure(&e->failures, &e->nfail, s->failures[j]);
				free(s->failures[j]);
			}
			s->nfail = 0;
		}
	}
	for (uint32_t i = 0; !reason[0] && i < e->nstreams; i++) {
		if (e->streams[i].count) {
			snprintf(reason, sizeof reason, "stream \"%s\" still has %u commands after the fence", e->streams[i].name, e->streams[i].count);
		}
	}
	cur = NULL;
	e->running = 0;
	e->input = NULL, e->input_len = 0;
	if (reason[0]) {
		snprintf(e->message, sizeof e->message, "emu: session quarantined: fence could not be proven: %s", reason);
		e->lost = xstrdup(e->message);
		r.outcome = STAGEHOST_EMU_QUARANTINED;
		r.message = e->lost;
		return r;
	}
	e->used -= e->freeing; /* the drain is proven: what the run freed is released */
	e->freeing = 0;
	size_t m = 0;
	e->message[0] = 0;
	for (uint32_t i = 0; i < e->nfail && m + 2 < sizeof e->message; i++) {
		m += (size_t)snprintf(e->message + m, sizeof e->message - m, "%s%s", i ? "; " : "", e->failures[i]);
	}
	if (code != 0) {
		r.outcome = STAGEHOST_EMU_CLIENT;
		r.code = code;
		r.message = e->err_msg;
		return r;
	}
	if (e->nfail || fence_fault) {
		r.outcome = STAGEHOST_EMU_FAULT;
		r.message = e->message;
		return r;
	}
	r.output = e->output, r.output_len = e->output_len;
	r.message = "";
	return r;
}
