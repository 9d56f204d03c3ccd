#include "comm/communicator.h"

#include <cstring>

#include "chorus/error.h"
#include "reduce/reduce.h"

namespace chorus {

void copySpanInputs(const std::vector<Span>& spans, size_t elementBytes) {
  for (const Span& s : spans)
    if (s.input() != s.data && s.count) std::memcpy(s.data, s.src, s.count * elementBytes);
}

void Communicator::allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op) {
  const size_t es = dtypeSize(dtype);
  if (spans.size() == 1) {
    copySpanInputs(spans, es);
    return allreduce(spans[0].data, spans[0].count, dtype, op);
  }
  size_t total = 0;
  for (const auto& s : spans) total += s.count;
  if (packed_.size() < total * es) packed_.resize(total * es);
  size_t off = 0;
  for (const auto& s : spans) {
    if (s.count) std::memcpy(packed_.data() + off, s.input(), s.count * es);
    off += s.count * es;
  }
  allreduce(packed_.data(), total, dtype, op);
  off = 0;
  for (const auto& s : spans) {
    if (s.count) std::memcpy(s.data, packed_.data() + off, s.count * es);
    off += s.count * es;
  }
}

void Communicator::allreduceSpansScaled(const std::vector<Span>& spans, DataType dtype, ReduceOp op, double scale) {
  allreduceSpans(spans, dtype, op);
  for (const Span& s : spans) scaleBuffer(dtype, s.data, s.count, scale);
}

void Communicator::reducescatterScaled(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                       ReduceOp op, double scale) {
  reducescatter(buf, out, counts, dtype, op);
  scaleBuffer(dtype, out, counts[rank()], scale);
}

}  // namespace chorus
