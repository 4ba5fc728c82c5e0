#!/bin/sh
# Regenerates kernels.ptx from kernels.cu (run by `go generate ./hw/cuda`,
# from hw/cuda; needs nvcc from CUDA 12 or later):
#
#	nvcc -ptx -arch=sm_90 -o kernels/kernels.ptx kernels/kernels.cu
#
# then lowers the PTX ISA version nvcc stamps (9.0 for CUDA 13) to 7.8, the
# lowest that targets sm_90, so that drivers from CUDA 11.8 on can JIT it;
# the kernels use no newer instruction. Validate with
#
#	ptxas -arch=sm_90 -o /dev/null kernels/kernels.ptx
#
# (hw/cuda/gpu-check.sh does both on a GPU machine).
set -eu
cd "$(dirname "$0")"
nvcc -ptx -arch=sm_90 -o kernels.ptx kernels.cu
sed -i 's/^\.version .*/.version 7.8/' kernels.ptx
