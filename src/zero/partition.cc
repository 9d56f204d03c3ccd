#include "zero/partition.h"

#include <algorithm>

#include "chorus/error.h"

namespace chorus::zero {

PartitionPlan::PartitionPlan(const std::vector<size_t>& numels, int world, size_t alignElems) : world_(world) {
  if (world <= 0) throw InvalidArgument("partition plan: world size must be positive");
  if (alignElems == 0) throw InvalidArgument("partition plan: alignment must be positive");
  offsets_.reserve(numels.size() + 1);
  size_t total = 0;
  for (size_t n : numels) {
    offsets_.push_back(total);
    total += n;
  }
  offsets_.push_back(total);
  const size_t per = (total + world - 1) / world;
  partition_ = std::max<size_t>((per + alignElems - 1) / alignElems * alignElems, alignElems);
}

std::vector<Segment> PartitionPlan::segmentsOf(int rank) const {
  if (rank < 0 || rank >= world_) throw InvalidArgument("partition plan: rank out of range");
  const size_t lo = static_cast<size_t>(rank) * partition_, hi = lo + partition_;
  std::vector<Segment> out;
  // The first tensor that ends after lo.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end() - 1, lo);
  size_t t = it == offsets_.begin() ? 0 : static_cast<size_t>(it - offsets_.begin()) - 1;
  for (; t + 1 < offsets_.size() && offsets_[t] < hi; ++t) {
    const size_t begin = std::max(lo, offsets_[t]), end = std::min(hi, offsets_[t + 1]);
    if (end > begin) out.push_back({t, begin - offsets_[t], begin, end - begin});
  }
  return out;
}

}  // namespace chorus::zero
