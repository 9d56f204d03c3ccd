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
// What a rank publishes about its buffer.
struct BufferNotice {
  uint32_t shared;  // the buffer lies in the sender's SharedPool
  SharedBufferRef ref;
};
// Where, after the notices, each rank says whether it mapped every peer's buffer.
constexpr size_t kMappedAt = 64;
static_assert(sizeof(BufferNotice) <= kMappedAt, "notice overlaps the mapped flag");
// A reduced block is written in L1 here, then streamed into every output.
constexpr size_t kBlockBytes = 16 << 10;
}  // namespace

// True (on every rank alike) when every rank's [buf, buf + bytes) lies in its
// pool and every rank could map every other's; then peerBuf_[j] is rank j's
// buffer, mapped here. Two barriers.
bool ShmCommunicator::mapPeerBuffers(const void* buf, size_t bytes) {
  const int n = size(), me = rank();
  const int bank = nextBank();
  auto notice = [&](int j) { return reinterpret_cast<BufferNotice*>(seg_->slot(bank, j)); };
  BufferNotice* my = notice(me);
  my->shared = SharedPool::instance()->describe(buf, bytes, &my->ref);
  seg_->barrier();  // every rank's notice is readable
  for (int j = 0; j < n; ++j)
    if (!notice(j)->shared) return false;
  peerMaps_.assign(n, nullptr);
  peerBuf_.assign(n, static_cast<char*>(const_cast<void*>(buf)));
  uint32_t mapped = 1;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    peerMaps_[j] = SharedPool::instance()->mapPeer(notice(j)->ref);
    if (peerMaps_[j]) peerBuf_[j] = peerMaps_[j].get() + notice(j)->ref.offset;
    else mapped = 0;
  }
  *reinterpret_cast<uint32_t*>(seg_->slot(bank, me) + kMappedAt) = mapped;
  seg_->barrier();  // every rank knows whether all could map
  for (int j = 0; j < n; ++j) {
    if (!*reinterpret_cast<uint32_t*>(seg_->slot(bank, j) + kMappedAt)) {
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
  if (!mapPeerBuffers(out, offset[n])) return false;
  const size_t mine = offset[me + 1] - offset[me];
  const char* src = static_cast<const char*>(in);
  char* own = static_cast<char*>(out) + offset[me];
  int first = 0;  // the first peer's copy shares the read of the input with my own
  for (int j = 0; j < n && mine; ++j) {
    if (j == me) continue;
    char* there = peerBuf_[j] + offset[me];
    if (!first++ && own != src) streamCopy(own, src, mine, there, true);
    else streamCopy(there, src, mine);
  }
  if (mine && !first && own != src) streamCopy(own, src, mine);
  peerMaps_.clear();
  seg_->barrier();  // every piece is in every output (streamed stores fenced by the barrier)
  return true;
}

// Rank r reduces part r. First every rank stages the parts the others reduce in
// its own output (already there when in place); then each reduces its part in
// rank order, from its own input and the others' staged parts, and streams the
// result into every output, over the staged copies (only the part's reducer
// reads those). Everything moves with streamed stores and is read from memory:
// no line passes between the cores' caches.
bool ShmCommunicator::allreduceDirect(const Span& span, DataType dtype, ReduceOp op) {
  const int n = size(), me = rank();
  const size_t es = dtypeSize(dtype);
  if (!mapPeerBuffers(span.data, span.count * es)) return false;
  char* own = static_cast<char*>(span.data);
  const char* in = static_cast<const char*>(span.input());
  size_t lo = 0, hi = 0;
  if (own != in) {
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      splitRange(span.count, n, j, &lo, &hi);
      streamCopy(own + lo * es, in + lo * es, (hi - lo) * es);
    }
  }
  seg_->barrier();  // every part is staged
  splitRange(span.count, n, me, &lo, &hi);
  block_.resize(kBlockBytes);
  inputs_.resize(n);
  const size_t block = kBlockBytes / es;
  for (size_t k = lo; k < hi; k += block) {
    const size_t m = std::min(block, hi - k);
    for (int j = 0; j < n; ++j) inputs_[j] = (j == me ? in : peerBuf_[j]) + k * es;
    reduceMany(dtype, op, block_.data(), inputs_.data(), n, m);
    for (int j = 0; j < n; ++j) streamCopy(peerBuf_[j] + k * es, block_.data(), m * es);
  }
  _mm_sfence();
  peerMaps_.clear();
  seg_->barrier();  // every part is in every output
  return true;
}

// Rank r reduces its piece straight from every rank's input: no copy into a
// slot, the inputs are only read. The last barrier keeps every input alive and
// unchanged until all pieces are reduced.
bool ShmCommunicator::reducescatterDirect(const void* buf, void* out, const std::vector<size_t>& off,
                                          DataType dtype, ReduceOp op) {
  const int n = size(), me = rank();
  const size_t es = dtypeSize(dtype);
  if (!mapPeerBuffers(buf, off[n] * es)) return false;
  const size_t count = off[me + 1] - off[me];
  char* dst = static_cast<char*>(out);
  const bool stream = count * es >= kStreamOutputBytes;
  if (stream) block_.resize(kBlockBytes);
  inputs_.resize(n);
  const size_t block = stream ? kBlockBytes / es : count;
  for (size_t k = 0; k < count; k += block) {
    const size_t m = std::min(block, count - k);
    for (int j = 0; j < n; ++j) inputs_[j] = peerBuf_[j] + (off[me] + k) * es;
    if (!stream) {
      reduceMany(dtype, op, dst + k * es, inputs_.data(), n, m);
      continue;
    }
    reduceMany(dtype, op, block_.data(), inputs_.data(), n, m);
    streamCopy(dst + k * es, block_.data(), m * es);
  }
  if (stream) _mm_sfence();
  peerMaps_.clear();
  seg_->barrier();  // nobody reads my input any more
  return true;
}

}  // namespace chorus
