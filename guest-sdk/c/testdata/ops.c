#include "stagehost.h"
#include <stdio.h>
#include <string.h>
int main(void) {
	stagehost_arg a[16];
	stagehost_tensor x = {7, 0, STAGEHOST_DTYPE_F32, 2, {3, 5}};
	stagehost_tensor y = {7, 64, STAGEHOST_DTYPE_F32, 2, {3, 5}};
	char name[32];
	uint32_t n = stagehost_op_softmax(a, x, y, 3);
	if (n != 5 || a[2].value != 3 || a[3].value != 5 || a[4].value != 3 || a[1].offset != 64 || a[1].length != 60) return 1;
	if (stagehost_op_name(name, "gemm", STAGEHOST_DTYPE_BF16, 1) != 14 || strcmp(name, "gemm.bf16.fast")) return 2;
	stagehost_tensor A = {1, 0, STAGEHOST_DTYPE_F32, 3, {4, 2, 3}}, B = {1, 0, STAGEHOST_DTYPE_F32, 2, {5, 3}}, C = {1, 0, STAGEHOST_DTYPE_F32, 3, {4, 2, 5}};
	n = stagehost_op_gemm(a, A, B, C, 0, 1, 1.0f, 0.0f);
	if (n != 14 || a[3].value != 2 || a[4].value != 5 || a[5].value != 3 || a[10].value != 4 || a[11].value != 6 || a[12].value != 0 || a[13].value != 10) return 3;
	uint32_t perm[2] = {1, 0};
	n = stagehost_op_transpose(a, x, y, perm);
	if (n != 10 || a[4].value != 3 || a[5].value != 5 || a[6].value != 0 || a[7].value != 1 || a[8].value != 3 || a[9].value != 2) return 4;
	stagehost_tensor bb = {1, 0, STAGEHOST_DTYPE_F32, 1, {5}};
	n = stagehost_op_binary(a, x, bb, y);
	if (n != 11 || a[5].value != 3 || a[6].value != 5 || a[9].value != 1 || a[10].value != 5) return 5;
	n = stagehost_op_reduce_sum(a, C, x, 1);
	if (n != 5 || a[2].value != 4 || a[3].value != 2 || a[4].value != 5) return 6;
	if (stagehost_op_exp(a, x, y) != 2 || stagehost_op_add(a, x, bb, y) != 11) return 7;
	puts("ok");
	return 0;
}
