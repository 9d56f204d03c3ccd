// Kernels for one instruction set; CMake sets this file's compile flags.
#define CHORUS_KERNEL_NS kernels_avx2
#include "reduce/kernels.inc"
