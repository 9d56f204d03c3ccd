#pragma once
// ZeRO's flat partitioning: tensors laid end to end in one flat buffer, padded
// so that it splits into `world` equal, aligned partitions; rank r owns
// [r * partitionElems, (r + 1) * partitionElems).
#include <cstddef>
#include <vector>

namespace chorus::zero {

struct Segment {
  size_t tensor;        // index in the tensor list
  size_t tensorOffset;  // first element of the tensor in this segment
  size_t flatOffset;    // where that element sits in the flat buffer
  size_t count;
};

class PartitionPlan {
 public:
  // alignElems: each partition's size is a multiple of it (SIMD- and bucket-friendly).
  PartitionPlan(const std::vector<size_t>& numels, int world, size_t alignElems = 16);

  int world() const { return world_; }
  size_t totalElems() const { return partition_ * world_; }  // padded
  size_t realElems() const { return offsets_.back(); }
  size_t partitionElems() const { return partition_; }
  size_t flatOffset(size_t tensor) const { return offsets_.at(tensor); }
  // The pieces of tensors that fall into rank's partition, in flat order.
  std::vector<Segment> segmentsOf(int rank) const;
  int ownerOf(size_t flatIndex) const { return static_cast<int>(flatIndex / partition_); }

 private:
  int world_;
  size_t partition_;
  std::vector<size_t> offsets_;  // flat offset of each tensor, then the real total
};

}  // namespace chorus::zero
