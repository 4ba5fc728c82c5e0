/*
 * Runs the shared cases (guest-sdk/testdata/emucases.txt, the path in
 * argv[1]) on the C emulator, emu.c: the table the Go and Rust emulators
 * and the host run. Prints "ok" and exits 0 when every case agrees.
 *
 *   cc -std=c11 -I.. emucases_test.c ../emu.c -lm && ./a.out ../../testdata/emucases.txt
 */
#include "stagehost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXLINES 256
#define MAXTOK 64

static char *script[MAXLINES];
static int nscript;
static char mismatch[2048];

static struct {
	char name[32];
	stagehost_handle h;
} vars[64];
static int nvars;

typedef struct {
	char s[512];
	int str, sub;
} tok;

static int tokenize(const char *l, tok *t) {
	int n = 0;
	while (*l && n < MAXTOK) {
		if (*l == ' ' || *l == '\t') {
			l++;
			continue;
		}
		int sub = l[0] == '~' && l[1] == '"';
		memset(&t[n], 0, sizeof t[n]);
		if (*l == '"' || sub) {
			l += sub ? 2 : 1;
			size_t k = 0;
			while (*l && *l != '"') {
				if (*l == '\\' && l[1]) {
					l++;
				}
				t[n].s[k++] = *l++;
			}
			if (*l) {
				l++;
			}
			t[n].str = !sub, t[n].sub = sub;
		} else {
			size_t k = 0;
			while (*l && *l != ' ' && *l != '\t') {
				t[n].s[k++] = *l++;
			}
		}
		n++;
	}
	return n;
}

static int fail(const char *line, const char *fmt, const char *a, const char *b) {
	char m[1536];
	snprintf(m, sizeof m, fmt, a, b);
	snprintf(mismatch, sizeof mismatch, "%s: %s", line, m);
	return 1;
}

static uint64_t u(const char *s) { return strtoull(s, NULL, 10); }

static int handle(const char *s, stagehost_handle *out) {
	if (strcmp(s, "0") == 0) {
		*out = 0;
		return 0;
	}
	if (s[0] != '$') {
		return 1;
	}
	char name[32];
	size_t n = strcspn(s + 1, "^!+");
	snprintf(name, sizeof name, "%.*s", (int)n, s + 1);
	const char *op = s + 1 + n;
	for (int i = 0; i < nvars; i++) {
		if (strcmp(vars[i].name, name) == 0) {
			stagehost_handle h = vars[i].h;
			if (strcmp(op, "^tag") == 0) {
				h ^= (uint64_t)1 << 32;
			} else if (strncmp(op, "!kind=", 6) == 0) {
				h = (h & ~((uint64_t)0xff << 56)) | u(op + 6) << 56;
			} else if (op[0] == '+') {
				h += u(op + 1);
			} else if (op[0]) {
				return 1;
			}
			*out = h;
			return 0;
		}
	}
	return 1;
}

static void bind(const char *name, stagehost_handle h) {
	for (int i = 0; i < nvars; i++) {
		if (strcmp(vars[i].name, name) == 0) {
			vars[i].h = h;
			return;
		}
	}
	snprintf(vars[nvars].name, sizeof vars[nvars].name, "%s", name);
	vars[nvars++].h = h;
}

static size_t unhex(const char *s, uint8_t *out) {
	if (strncmp(s, "hex:", 4) == 0) {
		s += 4;
	}
	size_t n = strlen(s) / 2;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		sscanf(s + 2 * i, "%2x", &v);
		out[i] = (uint8_t)v;
	}
	return n;
}

static int record(const char *w, stagehost_arg *r) {
	char a[5][64] = {{0}};
	memset(r, 0, sizeof *r);
	const char *open = strchr(w, '(');
	if (open) {
		int k = 0;
		size_t j = 0;
		for (const char *p = open + 1; *p && *p != ')'; p++) {
			if (*p == ',') {
				k++, j = 0;
			} else if (k < 5 && j < 63) {
				a[k][j++] = *p;
			}
		}
	}
	stagehost_handle h = 0;
	if (strncmp(w, "buf(", 4) == 0) {
		if (handle(a[0], &h)) {
			return 1;
		}
		*r = stagehost_buf(h, (uint32_t)u(a[1]), strcmp(a[2], "end") == 0 ? STAGEHOST_TO_END : (uint32_t)u(a[2]));
	} else if (strncmp(w, "f32(", 4) == 0) {
		*r = stagehost_f32(strtof(a[0], NULL));
	} else if (strncmp(w, "u64(", 4) == 0) {
		*r = stagehost_u64(u(a[0]));
	} else if (strncmp(w, "rec(", 4) == 0) {
		r->kind = (uint32_t)u(a[0]), r->offset = (uint32_t)u(a[1]), r->length = (uint32_t)u(a[2]), r->reserved = (uint32_t)u(a[3]);
		if (a[4][0] == '$') {
			if (handle(a[4], &h)) {
				return 1;
			}
			r->value = h;
		} else {
			r->value = u(a[4]);
		}
	} else {
		*r = stagehost_u64(u(w));
	}
	return 0;
}

static const char *status_name(stagehost_status st) {
	static const char *n[] = {"OK", "BUSY", "DEVICE_LOST", "UNSUPPORTED", "INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_BUDGET",
	                          "DEADLINE_EXCEEDED", "REJECTED", "FAULT", "CLOSED", "BAD_HANDLE", "STALE_HANDLE", "FOREIGN_HANDLE",
	                          "OUT_OF_BOUNDS", "OUTPUT_TOO_LARGE"};
	return st >= 0 && st < 16 ? n[st] : "UNKNOWN";
}

static int32_t code;

static int line(const char *l) {
	tok t[MAXTOK];
	int n = tokenize(l, t);
	char last[STAGEHOST_MAX_ERROR_MESSAGE + 1];
	if (strcmp(t[0].s, "return") == 0) {
		code = (int32_t)u(t[1].s);
		return 0;
	}
	if (strcmp(t[0].s, "lasterr") == 0) {
		stagehost_last_error_str(last, sizeof last);
		if ((t[1].str && strcmp(last, t[1].s) != 0) || (t[1].sub && !strstr(last, t[1].s))) {
			return fail(l, "last error \"%s\", want \"%s\"", last, t[1].s);
		}
		return 0;
	}
	int arrow = 0;
	for (int i = 0; i < n; i++) {
		if (!t[i].str && strcmp(t[i].s, "=>") == 0) {
			arrow = i;
		}
	}
	const char *f = t[1].s;
	tok *a = &t[2];
	stagehost_status st;
	uint32_t num = 0;
	int has_num = 0, has_h = 0, has_data = 0, has_text = 0;
	stagehost_handle h = 0, h0 = 0, h1 = 0;
	static uint8_t data[4096], in[4096];
	size_t dlen = 0;
	char text[512];
	if (arrow > 2 && a[0].s[0] == '$' && handle(a[0].s, &h0)) {
		return fail(l, "bad handle %s%s", a[0].s, "");
	}
	if (arrow > 3 && a[1].s[0] == '$' && handle(a[1].s, &h1)) {
		return fail(l, "bad handle %s%s", a[1].s, "");
	}
	if (strcmp(a[0].s, "0") == 0) {
		h0 = 0;
	}
	if (strcmp(f, "input_size") == 0) {
		st = stagehost_input_size(&num), has_num = 1;
	} else if (strcmp(f, "input_read") == 0) {
		uint32_t got = 0;
		st = stagehost_input_read((uint32_t)u(a[0].s), data, (uint32_t)u(a[1].s), &got);
		dlen = got, has_data = 1;
	} else if (strcmp(f, "output_write") == 0) {
		size_t k = unhex(a[0].s, in);
		st = stagehost_output_write(in, (uint32_t)k);
	} else if (strcmp(f, "entry_name") == 0) {
		uint32_t got = 0;
		st = stagehost_entry_name(text, (uint32_t)u(a[0].s), &got);
		if (st == STAGEHOST_OK) {
			text[got] = 0, has_text = 1;
		}
	} else if (strcmp(f, "error_set") == 0) {
		st = stagehost_error_set(a[0].s, stagehost_strlen(a[0].s));
	} else if (strcmp(f, "log") == 0) {
		st = stagehost_log((int32_t)u(a[0].s), a[1].s, stagehost_strlen(a[1].s));
	} else if (strcmp(f, "stream_get") == 0) {
		st = stagehost_stream_get(a[0].s, stagehost_strlen(a[0].s), &h), has_h = 1;
	} else if (strcmp(f, "buffer_get") == 0) {
		st = stagehost_buffer_get(a[0].s, stagehost_strlen(a[0].s), &h), has_h = 1;
	} else if (strcmp(f, "program_get") == 0) {
		st = stagehost_program_get(a[0].s, stagehost_strlen(a[0].s), &h), has_h = 1;
	} else if (strcmp(f, "weights_get") == 0) {
		st = stagehost_weights_get(a[0].s, stagehost_strlen(a[0].s), &h), has_h = 1;
	} else if (strcmp(f, "tensor_get") == 0) {
		stagehost_tensor_record rec;
		uint8_t raw[STAGEHOST_TENSOR_RECORD_SIZE];
		memset(&rec, 0, sizeof rec);
		st = stagehost_tensor_get(a[0].s, stagehost_strlen(a[0].s), &rec);
		memcpy(raw, &rec, sizeof raw);
		h = rec.buffer, has_h = 1;
		memcpy(data, raw + 8, sizeof raw - 8), dlen = sizeof raw - 8, has_data = 1;
	} else if (strcmp(f, "buffer_alloc") == 0) {
		st = stagehost_buffer_alloc((uint32_t)u(a[0].s), &h), has_h = 1;
	} else if (strcmp(f, "buffer_alloc_named") == 0) {
		st = stagehost_buffer_alloc_named(a[0].s, stagehost_strlen(a[0].s), (uint32_t)u(a[1].s), &h), has_h = 1;
	} else if (strcmp(f, "buffer_free") == 0) {
		st = stagehost_buffer_free(h0);
	} else if (strcmp(f, "buffer_size") == 0) {
		st = stagehost_buffer_size(h0, &num), has_num = 1;
	} else if (strcmp(f, "stream_write") == 0) {
		size_t k = unhex(a[3].s, in);
		st = stagehost_stream_write(h0, h1, (uint32_t)u(a[2].s), in, (uint32_t)k);
	} else if (strcmp(f, "stream_read") == 0) {
		dlen = (size_t)u(a[3].s);
		st = stagehost_stream_read(h0, h1, (uint32_t)u(a[2].s), data, (uint32_t)dlen), has_data = 1;
	} else if (strcmp(f, "stream_submit") == 0) {
		stagehost_arg recs[STAGEHOST_MAX_ARGS + 1];
		int k = 0;
		for (int i = 2; i < arrow - 2 && k <= STAGEHOST_MAX_ARGS; i++) {
			if (record(a[i].s, &recs[k++])) {
				return fail(l, "bad argument %s%s", a[i].s, "");
			}
		}
		st = stagehost_stream_submit(h0, h1, recs, (uint32_t)k);
	} else if (strcmp(f, "stream_submit_batch") == 0) {
		static stagehost_arg recs[8][STAGEHOST_MAX_ARGS];
		stagehost_command cmds[8];
		int nc = 0;
		for (int i = 1; i < arrow - 2 && nc < 8;) {
			stagehost_handle p;
			if (handle(a[i + 1].s, &p)) {
				return fail(l, "bad handle %s%s", a[i + 1].s, "");
			}
			int k = 0;
			for (i += 2; strcmp(a[i].s, "}") != 0; i++) {
				if (record(a[i].s, &recs[nc][k++])) {
					return fail(l, "bad argument %s%s", a[i].s, "");
				}
			}
			i++;
			cmds[nc].program = p;
			cmds[nc].args_ptr = stagehost_args_ptr(recs[nc]);
			cmds[nc].args_count = (uint32_t)k;
			nc++;
		}
		st = stagehost_stream_submit_batch(h0, cmds, (uint32_t)nc);
	} else if (strcmp(f, "stream_sync") == 0) {
		st = stagehost_stream_sync(h0);
	} else if (strcmp(f, "stream_idle") == 0) {
		st = stagehost_stream_idle(h0, &num), has_num = 1;
	} else {
		return fail(l, "unknown function %s%s", f, "");
	}
	if (strcmp(status_name(st), t[arrow + 1].s) != 0) {
		stagehost_last_error_str(last, sizeof last);
		char m[5200];
		snprintf(m, sizeof m, "status %s, want %s (last error \"%.*s\")", status_name(st), t[arrow + 1].s, 512, last);
		return fail(l, "%s%s", m, "");
	}
	for (int ri = arrow + 2; ri < n; ri++) {
	tok *r = &t[ri];
	if (r->str) {
		if (!has_text || strcmp(text, r->s) != 0) {
			return fail(l, "wrote \"%s\", want \"%s\"", has_text ? text : "", r->s);
		}
	} else if (r->s[0] == '$') {
		if (!has_h) {
			return fail(l, "no handle made%s%s", "", "");
		}
		bind(r->s + 1, h);
	} else if (strncmp(r->s, "hex:", 4) == 0) {
		char got[8200];
		for (size_t i = 0; i < dlen; i++) {
			sprintf(got + 2 * i, "%02x", data[i]);
		}
		got[2 * dlen] = 0;
		if (!has_data || strcmp(got, r->s + 4) != 0) {
			return fail(l, "read %s, want %s", got, r->s + 4);
		}
	} else if (!has_num || num != (uint32_t)u(r->s)) {
		char g[32];
		snprintf(g, sizeof g, "%u", num);
		return fail(l, "wrote %s, want %s", g, r->s);
	}
	}
	return 0;
}

static char *fence_lines[16];
static int nfence;

/* The case's module fence: its lines in order until one is not 0 (ok: 0;
 * code N: N; sync NAME: stream_sync's status). */
static int32_t fence(void) {
	for (int i = 0; i < nfence; i++) {
		const char *l = fence_lines[i];
		stagehost_status st = 1;
		if (strcmp(l, "ok") == 0) {
			st = 0;
		} else if (strncmp(l, "code ", 5) == 0) {
			st = (stagehost_status)u(l + 5);
		} else if (strncmp(l, "sync ", 5) == 0) {
			stagehost_handle s;
			st = stagehost_stream_get(l + 5, stagehost_strlen(l + 5), &s);
			if (st == STAGEHOST_OK) {
				st = stagehost_stream_sync(s);
			}
		}
		if (st != STAGEHOST_OK) {
			return st;
		}
	}
	return 0;
}

static int32_t stage(void) {
	nvars = 0;
	code = 0;
	for (int i = 0; i < nscript; i++) {
		if (line(script[i])) {
			stagehost_error_set(mismatch, stagehost_strlen(mismatch));
			return 99;
		}
	}
	return code;
}

/* hostile_headers checks that stagehost_emu_safetensors refuses the
 * headers the host's reader refuses, with its reason. */
static int hostile_headers(void) {
	static const struct {
		const char *json;
		uint32_t data;
		const char *want;
	} cases[] = {
	    {"[]", 0, "not a JSON object"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, "end beyond the data section"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "needs 8 bytes"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 8, "reversed"},
	    {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8, "unknown dtype"},
	    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 8, "rank above 8"},
	    {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 8, "overflows"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
	     "overlaps"},
	    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 8,
	     "given twice"},
	    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 8, "unknown field"},
	    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 8, "want dtype, shape and data_offsets"},
	    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 8, "non-negative"},
	    {"{\"__metadata__\":{\"k\":1}}", 8, "object of strings"},
	    {"{} x", 8, "data after"},
	};
	int failed = 0;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		static uint8_t file[1024];
		size_t n = strlen(cases[i].json);
		memset(file, 0, sizeof file);
		for (int k = 0; k < 8; k++) {
			file[k] = (uint8_t)((uint64_t)n >> 8 * k);
		}
		memcpy(file + 8, cases[i].json, n);
		char why[512] = "";
		stagehost_emu *e = stagehost_emu_new();
		if (stagehost_emu_safetensors(e, "w", file, 8 + n + cases[i].data, why, sizeof why) || !strstr(why, cases[i].want)) {
			fprintf(stderr, "safetensors %s: want a refusal saying \"%s\", got \"%s\"\n", cases[i].json, cases[i].want, why);
			failed++;
		}
		stagehost_emu_free(e);
	}
	uint8_t len[8] = {0, 0, 0, 0, 1, 0, 0, 0}; /* 2^32: above 100 MiB */
	char why[512] = "";
	stagehost_emu *e = stagehost_emu_new();
	if (stagehost_emu_safetensors(e, "w", len, 8, why, sizeof why) || !strstr(why, "above the limit")) {
		fprintf(stderr, "safetensors: a header length of 2^32: got \"%s\"\n", why);
		failed++;
	}
	stagehost_emu_free(e);
	return failed;
}

int main(int argc, char **argv) {
	if (hostile_headers()) {
		return 1;
	}
	FILE *f = fopen(argc > 1 ? argv[1] : "../../testdata/emucases.txt", "r");
	if (!f) {
		perror("emucases.txt");
		return 1;
	}
	static char buf[8192];
	static uint8_t input[4096], output[4096];
	char name[128] = "", outcome[64] = "ok";
	size_t input_len = 0, output_len = 0;
	int has_out = 0, cases = 0, failed = 0, lineno = 0, case_line = 0;
	stagehost_emu *e = NULL;
	while (fgets(buf, sizeof buf, f)) {
		lineno++;
		buf[strcspn(buf, "\r\n")] = 0;
		char *l = buf;
		while (*l == ' ' || *l == '\t') {
			l++;
		}
		if (!*l || *l == '#') {
			continue;
		}
		char *rest = strchr(l, ' ');
		rest = rest ? rest + 1 : l + strlen(l);
		if (strncmp(l, "case ", 5) == 0) {
			snprintf(name, sizeof name, "%s", rest);
			e = stagehost_emu_new();
			nscript = 0, nfence = 0, input_len = 0, output_len = 0, has_out = 0, case_line = lineno;
			strcpy(outcome, "ok");
		} else if (!e) {
			fprintf(stderr, "line %d: outside a case\n", lineno);
			return 1;
		} else if (strncmp(l, "stream ", 7) == 0) {
			stagehost_emu_stream(e, rest);
		} else if (strncmp(l, "buffer ", 7) == 0) {
			char bn[64];
			unsigned size;
			sscanf(rest, "%63s %u", bn, &size);
			stagehost_emu_buffer(e, bn, size);
		} else if (strncmp(l, "weights ", 8) == 0 || strncmp(l, "safetensors ", 12) == 0) {
			static char wn[128], wh[8192];
			static uint8_t wb[4096];
			char why[512];
			sscanf(rest, "%127s %8191s", wn, wh);
			size_t k = unhex(wh, wb);
			int ok = l[0] == 'w' ? stagehost_emu_weights(e, wn, wb, (uint32_t)k) : stagehost_emu_safetensors(e, wn, wb, k, why, sizeof why);
			if (!ok) {
				fprintf(stderr, "case %s: weights %s refused: %s\n", name, wn, l[0] == 'w' ? "" : why);
				return 1;
			}
		} else if (strncmp(l, "program ", 8) == 0) {
			if (!stagehost_emu_program(e, rest)) {
				fprintf(stderr, "case %s: program %s is not emulated\n", name, rest);
				return 1;
			}
		} else if (strncmp(l, "budget ", 7) == 0) {
			stagehost_emu_budget(e, u(rest));
		} else if (strncmp(l, "outlimit ", 9) == 0) {
			stagehost_emu_output_limit(e, (uint32_t)u(rest));
		} else if (strncmp(l, "input ", 6) == 0) {
			input_len = unhex(rest, input);
		} else if (strncmp(l, "outcome ", 8) == 0) {
			snprintf(outcome, sizeof outcome, "%s", rest);
		} else if (strncmp(l, "output", 6) == 0) {
			output_len = unhex(rest, output), has_out = 1;
		} else if (strncmp(l, "fence ", 6) == 0) {
			fence_lines[nfence] = malloc(strlen(rest) + 1);
			strcpy(fence_lines[nfence++], rest);
			stagehost_emu_fence(e, fence);
		} else if (strncmp(l, "call ", 5) == 0 || strncmp(l, "lasterr ", 8) == 0 || strncmp(l, "return ", 7) == 0) {
			script[nscript] = malloc(strlen(l) + 1);
			strcpy(script[nscript++], l);
		} else if (strcmp(l, "end") == 0) {
			stagehost_emu_result r = stagehost_emu_run(e, "main", input, (uint32_t)input_len, stage);
			int ok;
			if (strcmp(outcome, "ok") == 0) {
				ok = r.outcome == STAGEHOST_EMU_OK && (!has_out || (r.output_len == output_len && memcmp(r.output, output, output_len) == 0));
			} else if (strcmp(outcome, "fault") == 0) {
				ok = r.outcome == STAGEHOST_EMU_FAULT;
			} else if (strcmp(outcome, "quarantined") == 0) {
				ok = r.outcome == STAGEHOST_EMU_QUARANTINED;
			} else if (strncmp(outcome, "client ", 7) == 0) {
				ok = r.outcome == STAGEHOST_EMU_CLIENT && r.code == (int32_t)u(outcome + 7);
			} else {
				fprintf(stderr, "case %s: unknown outcome %s\n", name, outcome);
				return 1;
			}
			if (!ok) {
				printf("case %s (line %d): outcome %s, got outcome %d code %d: %s\n", name, case_line, outcome, r.outcome, r.code, r.message);
				failed++;
			}
			for (int i = 0; i < nscript; i++) {
				free(script[i]);
			}
			for (int i = 0; i < nfence; i++) {
				free(fence_lines[i]);
			}
			stagehost_emu_free(e);
			e = NULL;
			cases++;
		} else {
			fprintf(stderr, "line %d: unknown item %s\n", lineno, l);
			return 1;
		}
	}
	fclose(f);
	if (cases < 19) {
		printf("only %d cases\n", cases);
		return 1;
	}
	if (failed) {
		return 1;
	}
	printf("ok\n");
	return 0;
}
