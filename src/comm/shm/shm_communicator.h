#pragma once
// Collectives between the ranks of one host through a shared-memory segment.
// Data moves in rounds of one slot per rank; two banks of slots alternate, so a
// round needs one barrier (two for allreduce: written, then reduced).
#include <algorithm>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/shm/peer_path.h"
#include "comm/shm/shm_segment.h"

namespace chorus {

// Element range [lo, hi) of rank r when m elements are split among n ranks.
inline void splitRange(size_t m, int n, int r, size_t* lo, size_t* hi) {
  const size_t base = m / n, extra = m % n;
  *lo = r * base + (static_cast<size_t>(r) < extra ? r : extra);
  *hi = *lo + base + (static_cast<size_t>(r) < extra ? 1 : 0);
}

// Calls fn(i, at, len) for each piece of span i, from its element `at` on, that
// [a, b) of the spans' concatenation covers; span i starts at start[i] there.
template <typename Fn>
void forEachPiece(const std::vector<size_t>& start, size_t a, size_t b, Fn&& fn) {
  size_t i = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), a) - start.begin()) - 1;
  for (; a < b; ++i) {
    const size_t end = std::min(b, start[i + 1]);
    if (end > a) fn(i, a - start[i], end - a);
    a = std::max(a, end);
  }
}

// Outputs of this size and more (larger than a core's L2) are unlikely to be in
// cache when they are read next: they are written with non-temporal stores even
// where the op reads them (an in-place allreduce's), and ops this large choose
// their peer path (PeerPathChooser) by measuring.
constexpr size_t kStreamOutputBytes = 1 << 20;
// Outputs that a collective writes without reading them (all but an in-place
// allreduce's) are streamed from this size (a separate allreduce output at
// every size past the one reduced whole): an ordinary store first fetches each
// line it writes. 2 ranks, private outputs out of cache: 5-25% faster from
// 32-64 KiB on, level when they are in cache, slower at 4-16 KiB.
constexpr size_t kStreamUnreadBytes = 32 << 10;

class ShmCommunicator : public Communicator, public NegotiationPayload {
 public:
  void abort() override { seg_->abort(); }
  ShmCommunicator(std::unique_ptr<ShmSegment> seg, PeerPath peerPath = PeerPath::kAuto)
      : seg_(std::move(seg)), paths_(peerPath), slot_(seg_->slotBytes()) {}

  int rank() const override { return seg_->rank(); }
  int size() const override { return seg_->size(); }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  // Straight from and to the tensors: no packing into a fusion buffer.
  void allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op) override;
  // Every element is reduced and scaled by one rank, then copied: the same bits everywhere.
  void allreduceSpansScaled(const std::vector<Span>& spans, DataType dtype, ReduceOp op, double scale) override;
  void allreduceBitsOr(uint64_t* words, size_t count) override;
  NegotiationPayload* negotiationPayload() override { return this; }
  size_t payloadCapacity(size_t words) const override;
  void allreduceBitsOrWithPayload(uint64_t* words, size_t count, const void* payload, size_t bytes) override;
  const char* payloadOf(int r) const override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, size_t largestPiece) override;
  void reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void reducescatterScaled(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                           double scale) override;
  CommTraits traits() const override {
    return {.transport = "SHM", .reducescatterReadsOnly = true, .preemptChunkBytes = 1u << 20};
  }
  void barrier() override;
  CommTuning tuning() const override;
  void setTuning(const CommTuning& t) override;

 private:
  // Bytes per pipelined round: the segment's slot, or less where autotune chose.
  size_t slot() const { return slot_; }
  // The bank for the next round; every collective's rounds advance it alike on all ranks.
  int nextBank() { return static_cast<int>(round_++ & 1); }
  // Direct paths (shm_direct.cc), taken when every rank's output (reducescatter:
  // input) lies in its SharedPool: ranks write into each other's outputs, or read
  // each other's inputs, with no slot in between.
  struct Range {
    const void* data;
    size_t bytes;
  };
  bool mapPeerBuffers(const std::vector<Range>& ranges);
  bool allgatherDirect(const void* in, void* out, const std::vector<size_t>& offset);
  void reduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op, double scale);
  void scatterReduced(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                      double scale);
  bool allreduceDirect(const std::vector<Span>& spans, const std::vector<size_t>& start, DataType dtype, ReduceOp op,
                       double scale);
  bool reducescatterDirect(const void* buf, void* out, const std::vector<size_t>& off, DataType dtype, ReduceOp op,
                           double scale);

  std::unique_ptr<ShmSegment> seg_;
  uint64_t round_ = 0;
  PeerPathChooser paths_;
  size_t slot_;
  std::vector<const void*> inputs_;
  std::vector<std::shared_ptr<char>> peerMaps_;  // mappings held during a direct op
  std::vector<std::vector<char*>> peerBuf_;       // [rank][range]: where it starts in them
  // Where the last negotiation left the payloads: bank, offset in each slot, and
  // the round after it (a payload is readable only until the next round).
  int payloadBank_ = 0;
  size_t payloadOffset_ = 0;
  uint64_t payloadRound_ = ~uint64_t{0};
};

}  // namespace chorus
