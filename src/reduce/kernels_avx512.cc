// Kernels for one instruction set; CMake sets this file's compile flags.
#define CHORUS_KERNEL_NS kernels_avx512
#include "reduce/kernels.inc"
