#include "zero/partition.h"

#include <algorithm>

#include "chorus/error.h"

namespace chorus::zero {

namespace {
size_t roundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

PartitionPlan::PartitionPlan(const std::vector<size_t>& numels, int world, Layout layout, size_t bucketElems,
                             size_t alignElems)
    : world_(world), layout_(layout), numels_(numels), unitOf_(numels.size()), indexInUnit_(numels.size()) {
  if (world <= 0) throw InvalidArgument("partition plan: world size must be positive");
  if (alignElems == 0) throw InvalidArgument("partition plan: alignment must be positive");
  bucketElems = std::max<size_t>(bucketElems, 1);
  const size_t w = static_cast<size_t>(world);
  Unit cur;
  size_t curElems = 0;
  auto close = [&] {
    if (cur.params.empty()) return;
    if (layout_ == Layout::kContiguous) cur.slice = std::max(roundUp(curElems, w * alignElems) / w, alignElems);
    cur.worldOf = w;
    cur.partOffset = partition_;
    partition_ += cur.slice;
    units_.push_back(std::move(cur));
    cur = Unit{};
    curElems = 0;
  };
  for (size_t k = numels.size(); k-- > 0;) {
    const size_t n = numels[k];
    if (!cur.params.empty() && curElems + n > bucketElems) close();
    unitOf_[k] = units_.size();
    indexInUnit_[k] = cur.params.size();
    cur.params.push_back(k);
    if (layout_ == Layout::kContiguous) {
      cur.offsets.push_back(curElems);
    } else {
      const size_t s = std::max(roundUp((n + w - 1) / w, alignElems), alignElems);
      cur.offsets.push_back(cur.slice);
      cur.slices.push_back(s);
      cur.slice += s;
    }
    curElems += n;
  }
  close();
}

size_t PartitionPlan::paramSlice(size_t param) const {
  if (layout_ != Layout::kPerParam) throw InvalidArgument("partition plan: parameters have slices only per parameter");
  return units_[unitOf_.at(param)].slices[indexInUnit_[param]];
}

size_t PartitionPlan::maxUnitFlatElems() const {
  size_t m = 0;
  for (const auto& u : units_) m = std::max(m, u.flatElems());
  return m;
}

std::vector<Piece> PartitionPlan::pieces(int rank) const {
  if (rank < 0 || rank >= world_) throw InvalidArgument("partition plan: rank out of range");
  const size_t r = static_cast<size_t>(rank);
  std::vector<Piece> out;
  for (const auto& u : units_) {
    for (size_t j = 0; j < u.params.size(); ++j) {
      const size_t p = u.params[j], n = numels_[p];
      if (layout_ == Layout::kContiguous) {
        const size_t lo = r * u.slice, hi = lo + u.slice;
        const size_t begin = std::max(lo, u.offsets[j]), end = std::min(hi, u.offsets[j] + n);
        if (end > begin) out.push_back({p, begin - u.offsets[j], u.partOffset + begin - lo, end - begin});
      } else {
        const size_t s = u.slices[j], begin = std::min(n, r * s), end = std::min(n, (r + 1) * s);
        if (end > begin) out.push_back({p, begin, u.partOffset + u.offsets[j], end - begin});
      }
    }
  }
  return out;
}

}  // namespace chorus::zero
