#pragma once
// Copies into memory that will not be read again soon (outputs larger than a
// core's cache, slots that peers read from memory): non-temporal stores skip the
// read for ownership that ordinary stores pay, a third of a copy's traffic.
#include <cstddef>

namespace chorus {

// Copies n bytes from src to dst with non-temporal stores and, when also is
// given, to also (non-temporal too when alsoStream): one read of src for both.
// The caller fences (_mm_sfence) before others may read what it wrote.
void streamCopy(char* dst, const char* src, size_t n, char* also = nullptr, bool alsoStream = false);

// streamCopy when stream, memcpy otherwise.
void writeOut(char* dst, const char* src, size_t n, bool stream);

}  // namespace chorus
