/*
 * The gelu ops (gelu_tanh, gelu_erf and their .f16 and .bf16 variants) on
 * the C emulator, emu.c, against the simulator's values: the table
 * guest-sdk/testdata/gelu.txt (the path in argv[1]), generated from the
 * host's op library (hw/internal/ops, TestGeluValuesAreCurrent keeps it
 * current). Each value must be the simulator's, or the storage type's
 * next value of the same sign (1 ulp: both compute in float64 and round
 * once, and their float64 exp and erfc may differ in the last bit), and
 * NaN where it is NaN. Prints one line of counts per program, then "ok",
 * and exits 0 when every value agrees.
 *
 *   cc -std=c11 -I.. gelu_test.c ../emu.c -lm && ./a.out ../../testdata/gelu.txt
 */
#include "stagehost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXVALS 1024

static const char *prog;
static uint32_t nvals, size, xs[MAXVALS], want[MAXVALS];
static uint8_t in[4 * MAXVALS], out[4 * MAXVALS];

/* The stage: write the inputs, run the program, read the outputs. */
static int32_t stage(void) {
	stagehost_handle s, p, x, y;
	uint32_t n = nvals * size;
	if (stagehost_stream_get("s0", 2, &s) || stagehost_program_get(prog, (uint32_t)strlen(prog), &p) ||
	    stagehost_buffer_alloc(n, &x) || stagehost_buffer_alloc(n, &y) || stagehost_stream_write(s, x, 0, in, n)) {
		return 1;
	}
	stagehost_arg a[2] = {stagehost_whole(x), stagehost_whole(y)};
	if (stagehost_stream_submit(s, p, a, 2) || stagehost_stream_read(s, y, 0, out, n)) {
		return 1;
	}
	return stagehost_output_write(out, n);
}

/* got is want, or the next value of the same sign; NaN for NaN (a value
 * whose bits without the sign exceed inf's). */
static int within_one_ulp(uint32_t got, uint32_t w, uint32_t sign, uint32_t inf) {
	int gn = (got & ~sign) > inf, wn = (w & ~sign) > inf;
	if (gn || wn) {
		return gn && wn;
	}
	uint32_t gm = got & ~sign, wm = w & ~sign;
	return got == w || ((got & sign) == (w & sign) && (gm > wm ? gm - wm : wm - gm) == 1);
}

static int check(const char *path, const char *name, uint32_t sz, uint32_t sign, uint32_t inf) {
	FILE *f = fopen(path, "r");
	if (!f) {
		perror(path);
		return 1;
	}
	char line[128], op[64];
	unsigned x, yv;
	nvals = 0, size = sz, prog = name;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#' || line[0] == '\n') {
			continue;
		}
		if (sscanf(line, "%63s %x %x", op, &x, &yv) != 3) {
			fprintf(stderr, "%s: a line that is not PROGRAM X Y: %s", path, line);
			fclose(f);
			return 1;
		}
		if (strcmp(op, name) == 0 && nvals < MAXVALS) {
			xs[nvals] = x, want[nvals] = yv;
			memcpy(in + nvals * sz, &xs[nvals], sz); /* little-endian */
			nvals++;
		}
	}
	fclose(f);
	if (nvals < 300) {
		fprintf(stderr, "%s: %u values in %s\n", name, nvals, path);
		return 1;
	}
	stagehost_emu *e = stagehost_emu_new();
	stagehost_emu_stream(e, "s0");
	if (!stagehost_emu_program(e, name)) {
		fprintf(stderr, "%s is not emulated\n", name);
		return 1;
	}
	stagehost_emu_result r = stagehost_emu_run(e, NULL, NULL, 0, stage);
	if (r.outcome != STAGEHOST_EMU_OK || r.output_len != nvals * sz) {
		fprintf(stderr, "%s: outcome %d: %s\n", name, r.outcome, r.message);
		return 1;
	}
	uint32_t exact = 0;
	for (uint32_t i = 0; i < nvals; i++) {
		uint32_t got = 0;
		memcpy(&got, r.output + i * sz, sz);
		if (!within_one_ulp(got, want[i], sign, inf)) {
			fprintf(stderr, "%s(%#x) = %#x, the simulator gives %#x\n", name, xs[i], got, want[i]);
			return 1;
		}
		exact += got == want[i];
	}
	stagehost_emu_free(e);
	printf("%s: %u of %u values the simulator's bit for bit\n", name, exact, nvals);
	return 0;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s gelu.txt\n", argv[0]);
		return 2;
	}
	/* The rule itself. */
	if (!within_one_ulp(0x3f800001, 0x3f800000, 0x80000000, 0x7f800000) || within_one_ulp(0x3f800002, 0x3f800000, 0x80000000, 0x7f800000) ||
	    within_one_ulp(0x80000000, 0, 0x80000000, 0x7f800000) || within_one_ulp(0x7fc00000, 0x7f800000, 0x80000000, 0x7f800000) ||
	    !within_one_ulp(0xffc00000, 0x7fc00000, 0x80000000, 0x7f800000)) {
		fprintf(stderr, "within_one_ulp is wrong\n");
		return 1;
	}
	static const char *ops[] = {"gelu_tanh", "gelu_erf"};
	char name[64];
	for (int i = 0; i < 2; i++) {
		if (check(argv[1], ops[i], 4, 0x80000000u, 0x7f800000u)) {
			return 1;
		}
		snprintf(name, sizeof name, "%s.f16", ops[i]);
		if (check(argv[1], name, 2, 0x8000u, 0x7c00u)) {
			return 1;
		}
		snprintf(name, sizeof name, "%s.bf16", ops[i]);
		if (check(argv[1], name, 2, 0x8000u, 0x7f80u)) {
			return 1;
		}
	}
	puts("ok");
	return 0;
}
