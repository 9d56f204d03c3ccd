#include "comm/shm/stream_copy.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "reduce/reduce.h"

namespace chorus {

namespace {
// The loops take whole 64-byte lines, dst aligned to 64; also aligned to the
// vector when alsoStream. Measured on an AMD EPYC VM (2-rank allgathers, A/B
// call by call): writing both the output and a slot with non-temporal stores,
// 32-byte stores were 25% faster than 16-byte ones (64 MiB: 11.2 against
// 14.8 ms); with only the output streamed they were 5-10% slower (16 MiB: 2.75
// against 2.55 ms).
__attribute__((target("avx"))) void linesAvx(char* dst, const char* src, size_t n, char* also, bool alsoStream) {
  for (size_t i = 0; i < n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    if (!also) continue;
    if (alsoStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(also + i), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(also + i + 32), b);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(also + i), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(also + i + 32), b);
    }
  }
}

void linesSse(char* dst, const char* src, size_t n, char* also, bool alsoStream) {
  for (size_t i = 0; i < n; i += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * k));
    for (int k = 0; k < 4; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16 * k), v[k]);
    if (!also) continue;
    for (int k = 0; k < 4; ++k) {
      auto* p = reinterpret_cast<__m128i*>(also + i + 16 * k);
      if (alsoStream) _mm_stream_si128(p, v[k]);
      else _mm_storeu_si128(p, v[k]);
    }
  }
}

using Lines = void (*)(char*, const char*, size_t, char*, bool);
struct LineCopy {
  Lines fn;
  uintptr_t alsoAlign;  // alignment non-temporal stores to `also` need
};
// AVX wherever the reduction kernels run AVX2 or better (CHORUS_SIMD lowers both).
LineCopy pick() {
  if (std::strcmp(simdLevel(), "generic") != 0) return {linesAvx, 32};
  return {linesSse, 16};
}
}  // namespace

void streamCopy(char* dst, const char* src, size_t n, char* also, bool alsoStream) {
  static const LineCopy wide = pick();
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  if (also) std::memcpy(also, src, head);
  const size_t body = (n - head) & ~size_t{63};
  // Non-temporal stores need alignment; also may sit differently from dst.
  const uintptr_t alsoAt = also ? reinterpret_cast<uintptr_t>(also + head) : 0;
  alsoStream = alsoStream && also && alsoAt % 16 == 0;
  // 32-byte stores only for two streams of non-temporal stores (measured above).
  const Lines fn = alsoStream && alsoAt % wide.alsoAlign == 0 ? wide.fn : linesSse;
  fn(dst + head, src + head, body, also ? also + head : nullptr, alsoStream);
  const size_t done = head + body;
  std::memcpy(dst + done, src + done, n - done);
  if (also) std::memcpy(also + done, src + done, n - done);
}

namespace {
// Both sides are fetched this far ahead, within the buffers only: a line past
// the end may be a peer's slot that it is writing. 2-rank 64-256 KiB allreduces
// of fresh buffers 4-7% faster (Intel Ice Lake VM, A/B call by call); the
// distance (512 B-2 KiB) and prefetchw against prefetcht0 made no difference.
constexpr size_t kAhead = 1024;

inline void prefetchAhead(const char* dst, const char* src, size_t i, size_t n) {
  if (i + kAhead >= n) return;
  _mm_prefetch(src + i + kAhead, _MM_HINT_T0);
  _mm_prefetch(dst + i + kAhead, _MM_HINT_T0);
}

__attribute__((target("avx"))) void copyAvx(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    prefetchAhead(dst, src, i, n);
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
}
void copySse(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    prefetchAhead(dst, src, i, n);
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * k));
    for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16 * k), v[k]);
  }
}
}  // namespace

void copyBytes(char* dst, const char* src, size_t n) {
  static const auto body = std::strcmp(simdLevel(), "generic") != 0 ? copyAvx : copySse;
  if (n < 256) return static_cast<void>(std::memcpy(dst, src, n));
  // Whole lines of the destination: a store never splits a line it shares with
  // the next store's.
  const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
  std::memcpy(dst, src, head);
  const size_t lines = (n - head) & ~size_t{63};
  body(dst + head, src + head, lines);
  std::memcpy(dst + head + lines, src + head + lines, n - head - lines);
}

void writeOut(char* dst, const char* src, size_t n, bool stream) {
  if (stream) streamCopy(dst, src, n);
  else copyBytes(dst, src, n);
}

void reduceOut(DataType dtype, ReduceOp op, void* dst, const void* const* inputs, int n, size_t count, bool stream,
               double scale) {
  if (!stream) return reduceMany(dtype, op, dst, inputs, n, count, scale);
  void* outs[1] = {dst};
  reduceManyStreamed(dtype, op, nullptr, outs, 1, inputs, n, count, scale);
}

}  // namespace chorus
