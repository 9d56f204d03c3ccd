#pragma once
// Adasum (Maleki et al. 2020, Horovod's op=Adasum): two gradients a and b
// combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, tensor by tensor:
// their sum where they are orthogonal, their mean where they are equal.
#include <cstddef>

#include "chorus/types.h"

namespace chorus {

// Combines n ranks' count-element vectors (inputs[j]: rank j's) into out, in
// a binary tree over rank order: 0 with 1, 2 with 3, then (0,1) with (2,3), ...
// For a power-of-two n this is the tree Horovod's vector-halving reduction
// computes; for any other n an unpaired subtree waits for the level above.
// Floating dtypes only; float16/bfloat16 are combined in float32 and rounded
// once. Every rank given the same inputs gets the same bits.
void adasumCombine(DataType dtype, void* out, const void* const* inputs, int n, size_t count);

}  // namespace chorus
