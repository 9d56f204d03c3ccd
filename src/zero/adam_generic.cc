// Adam kernel for one instruction set; CMake sets the compile flags.
#define CHORUS_KERNEL_NS adam_generic
#include "zero/adam_kernels.inc"
