#include "comm/communicator.h"

#include <cstring>

namespace chorus {

void Communicator::allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op) {
  const size_t es = dtypeSize(dtype);
  if (spans.size() == 1) {
    const Span& s = spans[0];
    if (s.src && s.src != s.data && s.count) std::memcpy(s.data, s.src, s.count * es);
    return allreduce(s.data, s.count, dtype, op);
  }
  size_t total = 0;
  for (const auto& s : spans) total += s.count;
  if (packed_.size() < total * es) packed_.resize(total * es);
  size_t off = 0;
  for (const auto& s : spans) {
    if (s.count) std::memcpy(packed_.data() + off, s.src ? s.src : s.data, s.count * es);
    off += s.count * es;
  }
  allreduce(packed_.data(), total, dtype, op);
  off = 0;
  for (const auto& s : spans) {
    if (s.count) std::memcpy(s.data, packed_.data() + off, s.count * es);
    off += s.count * es;
  }
}

}  // namespace chorus
