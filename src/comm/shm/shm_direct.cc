// Shared-memory collectives on buffers every rank can reach: each rank's output
// (or, for reducescatter, input) comes from its SharedPool, and the peers map it
// through /proc/<pid>/fd.
#include <emmintrin.h>

#include <algorithm>

#include "comm/shm/shared_pool.h"
#include "comm/shm/shm_communicator.h"
#include "comm/shm/stream_copy.h"
#include "reduce/reduce.h"

namespace chorus {

namespace {
// What a rank publishes about its buffers; a SharedBufferRef per range follows.
struct BufferNotice {
  uint32_t shared;  // every range lies in the sender's SharedPool
  uint32_t mapped;  // the sender mapped every peer's ranges (written after the first barrier)
  uint64_t count;
};
}  // namespace

// True (on every rank alike) when every rank's ranges lie in its pool and every
// rank could map every other's; then peerBuf_[j][i] is rank j's range i, mapped
// here. The ranks pass ranges of the same sizes. Two barriers.
bool ShmCommunicator::mapPeerBuffers(const std::vector<Range>& ranges) {
  const int n = size(), me = rank();
  const size_t k = ranges.size();
  if (sizeof(BufferNotice) + k * sizeof(SharedBufferRef) > seg_->slotBytes()) return false;
  const int bank = nextBank();
  auto notice = [&](int j) { return reinterpret_cast<BufferNotice*>(seg_->slot(bank, j)); };
  auto refs = [&](int j) { return reinterpret_cast<SharedBufferRef*>(notice(j) + 1); };
  BufferNotice* my = notice(me);
  my->shared = 1;
  my->count = k;
  for (size_t i = 0; i < k; ++i) {
    refs(me)[i] = SharedBufferRef{};
    if (ranges[i].bytes && !SharedPool::instance()->describe(ranges[i].data, ranges[i].bytes, &refs(me)[i]))
      my->shared = 0;
  }
  seg_->barrier();  // every rank's notice is readable
  for (int j = 0; j < n; ++j)
    if (!notice(j)->shared) return false;
  peerMaps_.clear();
  peerBuf_.assign(n, std::vector<char*>(k, nullptr));
  uint32_t mapped = 1;
  for (int j = 0; j < n; ++j) {
    for (size_t i = 0; i < k; ++i) {
      if (j == me) {
        peerBuf_[j][i] = static_cast<char*>(const_cast<void*>(ranges[i].data));
        continue;
      }
      const SharedBufferRef& ref = refs(j)[i];
      if (!ref.bytes) continue;  // an empty range
      std::shared_ptr<char> m = SharedPool::instance()->mapPeer(ref);
      if (!m) {
        mapped = 0;
        continue;
      }
      peerBuf_[j][i] = m.get() + ref.offset;
      peerMaps_.push_back(std::move(m));
    }
  }
  my->mapped = mapped;
  seg_->barrier();  // every rank knows whether all could map
  for (int j = 0; j < n; ++j) {
    if (!notice(j)->mapped) {
      peerMaps_.clear();
      return false;
    }
  }
  return true;
}

// Each rank writes its piece straight into all outputs: one read of the input,
// no slot to hand over (a 2-rank 64 MiB allgather moves 1.5S through memory per
// rank instead of 2.5S).
bool ShmCommunicator::allgatherDirect(const void* in, void* out, const std::vector<size_t>& offset) {
  const int n = size(), me = rank();
  if (!mapPeerBuffers({{out, offset[n]}})) return false;
  const size_t mine = offset[me + 1] - offset[me];
  const char* src = static_cast<const char*>(in);
  char* own = static_cast<char*>(out) + offset[me];
  int first = 0;  // the first peer's copy shares the read of the input with my own
  for (int j = 0; j < n && mine; ++j) {
    if (j == me) continue;
    char* there = peerBuf_[j][0] + offset[me];
    if (!first++ && own != src) streamCopy(own, src, mine, there, true);
    else streamCopy(there, src, mine);
  }
  if (mine && !first && own != src) streamCopy(own, src, mine);
  peerMaps_.clear();
  seg_->barrier();  // every piece is in every output (streamed stores fenced by the barrier)
  return true;
}

// Rank r reduces part r of the spans' concatenation. First every rank stages the
// parts the others reduce in its own outputs (already there when in place); then
// each reduces its part in rank order, from its own inputs and the others' staged
// parts, and streams the result into every output, over the staged copies (only
// the part's reducer reads those). Everything moves with streamed stores and is
// read from memory: no line passes between the cores' caches.
bool ShmCommunicator::allreduceDirect(const std::vector<Span>& spans, const std::vector<size_t>& start,
                                      DataType dtype, ReduceOp op, double scale) {
  const int n = size(), me = rank();
  const size_t es = dtypeSize(dtype);
  std::vector<Range> ranges;
  for (const Span& s : spans) ranges.push_back({s.data, s.count * es});
  if (!mapPeerBuffers(ranges)) return false;
  const size_t count = start.back();
  size_t lo = 0, hi = 0;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    splitRange(count, n, j, &lo, &hi);
    forEachPiece(start, lo, hi, [&](size_t i, size_t at, size_t len) {
      const char* in = static_cast<const char*>(spans[i].input()) + at * es;
      char* own = static_cast<char*>(spans[i].data) + at * es;
      if (own != in) streamCopy(own, in, len * es);
    });
  }
  seg_->barrier();  // every part is staged
  splitRange(count, n, me, &lo, &hi);
  inputs_.resize(n);
  std::vector<void*> outs(n);
  forEachPiece(start, lo, hi, [&](size_t i, size_t at, size_t len) {
    const char* in = static_cast<const char*>(spans[i].input());
    for (int j = 0; j < n; ++j) {
      inputs_[j] = (j == me ? in : peerBuf_[j][i]) + at * es;
      outs[j] = peerBuf_[j][i] + at * es;
    }
    reduceManyStreamed(dtype, op, nullptr, outs.data(), n, inputs_.data(), n, len, scale);
  });
  _mm_sfence();
  peerMaps_.clear();
  seg_->barrier();  // every part is in every output
  return true;
}

// Rank r reduces its piece straight from every rank's input: no copy into a
// slot, the inputs are only read. The last barrier keeps every input alive and
// unchanged until all pieces are reduced.
bool ShmCommunicator::reducescatterDirect(const void* buf, void* out, const std::vector<size_t>& off,
                                          DataType dtype, ReduceOp op, double scale) {
  const int n = size(), me = rank();
  const size_t es = dtypeSize(dtype);
  if (!mapPeerBuffers({{buf, off[n] * es}})) return false;
  const size_t count = off[me + 1] - off[me];
  char* dst = static_cast<char*>(out);
  const bool stream = count * es >= kStreamUnreadBytes;
  inputs_.resize(n);
  for (int j = 0; j < n; ++j) inputs_[j] = peerBuf_[j][0] + off[me] * es;
  reduceOut(dtype, op, dst, inputs_.data(), n, count, stream, scale);
  if (stream) _mm_sfence();
  peerMaps_.clear();
  seg_->barrier();  // nobody reads my input any more
  return true;
}

}  // namespace chorus
