#pragma once
// Copies into memory that will not be read again soon (outputs larger than a
// core's cache, slots that peers read from memory): non-temporal stores skip the
// read for ownership that ordinary stores pay, a third of a copy's traffic.
#include <cstddef>

#include "chorus/types.h"

namespace chorus {

// Copies n bytes from src to dst with non-temporal stores and, when also is
// given, to also (non-temporal too when alsoStream): one read of src for both.
// The caller fences (_mm_sfence) before others may read what it wrote.
void streamCopy(char* dst, const char* src, size_t n, char* also = nullptr, bool alsoStream = false);

// Copies n bytes with ordinary vector stores. Unlike glibc's memcpy, whose
// `rep movsb` runs at half speed and worse on AMD Zen when source and
// destination sit differently within a cache line (a 2-rank 64 KiB allreduce of
// 16-byte-aligned buffers took 59 instead of 27 us).
void copyBytes(char* dst, const char* src, size_t n);

// streamCopy when stream, copyBytes otherwise.
void writeOut(char* dst, const char* src, size_t n, bool stream);

// Reduces count elements of the n inputs into dst (times scale, floating
// dtypes): reduceManyStreamed when stream (the caller fences), reduceMany otherwise.
void reduceOut(DataType dtype, ReduceOp op, void* dst, const void* const* inputs, int n, size_t count, bool stream,
               double scale = 1.0);

}  // namespace chorus
