// Adam, Lion, Adagrad and LAMB kernels for one instruction set; CMake sets the compile flags.
#define CHORUS_KERNEL_NS adam_avx2
#include "reduce/adam_kernels.inc"
#include "reduce/optim_kernels.inc"
