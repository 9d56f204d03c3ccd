#pragma once
// Collectives between the ranks of one host through a shared-memory segment.
// Data moves in rounds of one slot per rank; two banks of slots alternate, so a
// round needs one barrier (two for allreduce: written, then reduced).
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/shm/peer_path.h"
#include "comm/shm/shm_segment.h"

namespace chorus {

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(std::unique_ptr<ShmSegment> seg, PeerPath peerPath = PeerPath::kAuto)
      : seg_(std::move(seg)), paths_(peerPath) {}

  int rank() const override { return seg_->rank(); }
  int size() const override { return seg_->size(); }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  // Straight from and to the tensors: no packing into a fusion buffer.
  void allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op) override;
  void allreduceBitsOr(uint64_t* words, size_t count) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, size_t largestPiece) override;
  void reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  bool reducescatterReadsOnly() const override { return true; }
  void barrier() override;

 private:
  // The bank for the next round; every collective's rounds advance it alike on all ranks.
  int nextBank() { return static_cast<int>(round_++ & 1); }

  std::unique_ptr<ShmSegment> seg_;
  uint64_t round_ = 0;
  PeerPathChooser paths_;
  std::vector<const void*> inputs_;
};

}  // namespace chorus
