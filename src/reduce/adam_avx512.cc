// Adam kernel for one instruction set; CMake sets the compile flags.
#define CHORUS_KERNEL_NS adam_avx512
#include "reduce/adam_kernels.inc"
