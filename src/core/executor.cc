#include "core/executor.h"

#include <cstring>

#include "chorus/error.h"
#include "reduce/adasum.h"
#include "reduce/reduce.h"
#include "core/executor_ops.h"

namespace chorus {

namespace {

Shape tailOf(const Shape& s) { return s.empty() ? Shape{} : Shape(s.begin() + 1, s.end()); }

size_t rowBytes(const Response& r) {
  return static_cast<size_t>(numElements(tailOf(r.shape))) * dtypeSize(r.dtype);
}

}  // namespace

void* allocateOutput(Entry& e, const Shape& shape, std::exception_ptr* err, const OwnStorage& own,
                     int32_t device) {
  const size_t bytes = static_cast<size_t>(numElements(shape)) * dtypeSize(e.req.dtype);
  void* p = nullptr;
  if (e.alloc) {
    try {
      p = e.alloc(shape, e.req.dtype);
      if (!p && bytes > 0) throw InvalidArgument("output allocator returned null for '" + e.req.name + "'");
    } catch (...) {
      *err = std::current_exception();
      p = nullptr;
    }
  }
  if (!p) {
    std::shared_ptr<void> buf = own ? own(bytes) : allocateShared(bytes);
    p = buf.get();
    e.work->owned.push_back(std::move(buf));
  }
  e.output = Tensor{p, e.req.dtype, shape, device};
  return p;
}

void finishEntry(EntryTable& entries, EntryTable::iterator it, const Executor::Release& release,
                 std::exception_ptr err) {
  Entry e = std::move(it->second);
  entries.erase(it);
  if (release) release(e.req.name);
  if (!err) e.work->outputs[e.part] = std::move(e.output);
  e.work->complete(err);
}

void Executor::fail(const Response& r, EntryTable& entries) {
  auto it = entries.find(r.name);
  if (it == entries.end()) return;
  if (timeline_ && timeline_->active()) {  // (closes its QUEUE span)
    timeline_->opStart(r.name, r.type, OpSpanArgs{r.bytes(), r.dtype, r.priority, setId_, "ERROR", 1});
    timeline_->opEnd(r.name);
  }
  std::exception_ptr err = r.errorKind == ErrorKind::kMismatch  ? std::make_exception_ptr(Mismatch(r.error))
                           : r.errorKind == ErrorKind::kStalled ? std::make_exception_ptr(StallError(r.error))
                                                                : std::make_exception_ptr(Refused(r.error));
  finishEntry(entries, it, release_, err);
}

void Executor::buildSpans(const Response* const* group, size_t n, EntryTable& entries, std::vector<Span>& spans,
                          std::vector<char>& zeros) {
  const Response& head = *group[0];
  // The outputs are the buffers; an unscaled input is read where it is (no copy
  // into the output first), a prescaled one is scaled into the output. Ranks that
  // joined contribute zeros.
  size_t missing = 0;
  for (size_t i = 0; i < n; ++i)
    if (!entries.count(group[i]->name)) missing += group[i]->bytes();
  zeros.assign(std::max<size_t>(missing, 1), 0);
  spans.clear();
  size_t zeroAt = 0;
  for (size_t i = 0; i < n; ++i) {
    const Response* r = group[i];
    auto it = entries.find(r->name);
    const size_t count = static_cast<size_t>(numElements(r->shape));
    if (it != entries.end()) {
      const Entry& e = it->second;
      if (head.prescale == 1.0) {
        spans.push_back({e.output.data, count, e.input.data});
      } else {
        scaleCopy(r->dtype, e.output.data, e.input.data, count, head.prescale);
        spans.push_back({e.output.data, count});
      }
    } else {
      spans.push_back({zeros.data() + zeroAt, count});
      zeroAt += r->bytes();
    }
  }
}

void Executor::runAllreduce(const std::vector<const Response*>& group, EntryTable& entries, bool fromPayload) {
  const Response& head = *group.front();
  ++batches_;
  tensors_ += static_cast<int64_t>(group.size());
  if (head.op == ReduceOp::kAdasum) return runAdasum(group, entries, fromPayload);
  std::vector<Span>& spans = spans_;
  buildSpans(group.data(), group.size(), entries, spans, scratch_);
  // Average's division (and a postscale) is applied as the elements are
  // reduced where it can be, not in a pass of its own: 2-rank float32 Average
  // allreduce was 40-70% slower than Sum at every size before.
  const double fold = foldedScale(head, comm_.size());
  if (fromPayload) {
    // Reduced whole, in rank order (my own part from my input: the same values),
    // so that every rank gets the same bits.
    const Span& s = spans.front();
    reduceMany(head.dtype, head.op, s.data, sentInputs(s.input(), 0), comm_.size(), s.count, fold ? fold : 1.0);
  } else if (fold) {
    comm_.allreduceSpansScaled(spans, head.dtype, head.op, fold);
  } else {
    comm_.allreduceSpans(spans, head.dtype, head.op);
  }
  for (const Response* r : group) {
    auto it = entries.find(r->name);
    if (it != entries.end()) {
      if (!fold) postProcess(head, it->second.output.data, static_cast<size_t>(numElements(r->shape)), comm_.size());
      finishEntry(entries, it, release_);
    }
  }
}

// Adasum is not element-wise: every rank gathers every rank's (fused) input and
// combines each tensor in the same tree, so all get the same bits. This moves
// (size - 1) times the data a reduce-scatter would: simple and exact, and what
// the CPU gradients it is used for can afford; a joined rank sends zeros.
void Executor::runAdasum(const std::vector<const Response*>& group, EntryTable& entries, bool fromPayload) {
  const Response& head = *group.front();
  const int n = comm_.size();
  size_t total = 0;
  for (const Response* r : group) total += r->bytes();
  const char* base = nullptr;  // rank j's contribution starts at base + j * total
  if (!fromPayload) {
    scratch_.assign(std::max<size_t>(total, 1), 0);
    size_t at = 0;
    for (const Response* r : group) {
      auto it = entries.find(r->name);
      if (it != entries.end())
        scaleCopy(r->dtype, scratch_.data() + at, it->second.input.data, static_cast<size_t>(numElements(r->shape)),
                  head.prescale);
      at += r->bytes();
    }
    gathered_.resize(std::max<size_t>(total * n, 1));
    comm_.allgatherv(scratch_.data(), gathered_.data(), std::vector<size_t>(n, total));
    base = gathered_.data();
  }
  size_t at = 0;
  for (const Response* r : group) {
    auto it = entries.find(r->name);
    if (it != entries.end()) {
      Entry& e = it->second;
      const size_t count = static_cast<size_t>(numElements(r->shape));
      const void* const* inputs = fromPayload ? sentInputs(e.input.data, 0) : nullptr;
      if (!fromPayload) {
        payloadInputs_.resize(n);
        for (int j = 0; j < n; ++j) payloadInputs_[j] = base + static_cast<size_t>(j) * total + at;
        inputs = payloadInputs_.data();
      }
      adasumCombine(r->dtype, e.output.data, inputs, n, count);
      if (r->postscale != 1.0) scaleBuffer(r->dtype, e.output.data, count, r->postscale);
      finishEntry(entries, it, release_);
    }
    at += r->bytes();
  }
}

const char* Executor::sent(int j, const void* mine) const {
  return j == comm_.rank() ? static_cast<const char*>(mine) : comm_.negotiationPayload()->payloadOf(j);
}

const void* const* Executor::sentInputs(const void* mine, size_t at) {
  payloadInputs_.resize(comm_.size());
  for (int j = 0; j < comm_.size(); ++j) payloadInputs_[j] = sent(j, mine) + at;
  return payloadInputs_.data();
}

void Executor::runAllgather(const Response& r, EntryTable& entries, bool fromPayload) {
  auto it = entries.find(r.name);
  const int n = comm_.size();
  const size_t rb = rowBytes(r);
  std::vector<size_t> bytes(n);
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    bytes[i] = static_cast<size_t>(r.rows[i]) * rb;
    rows += r.rows[i];
  }
  if (it == entries.end()) {  // joined: gives no rows, takes the others' into scratch
    if (fromPayload) return;
    scratch_.resize(std::max<size_t>(static_cast<size_t>(rows) * rb, 1));
    comm_.allgatherv(scratch_.data(), scratch_.data(), bytes);
    return;
  }
  Shape outShape = tailOf(r.shape);
  outShape.insert(outShape.begin(), rows);
  Entry& e = it->second;
  std::exception_ptr allocErr;
  void* out = allocateOutput(e, outShape, &allocErr);
  if (fromPayload) {
    char* to = static_cast<char*>(out);
    for (int j = 0; j < n; to += bytes[j], ++j)
      if (bytes[j]) std::memcpy(to, sent(j, e.input.data), bytes[j]);
  } else {
    comm_.allgatherv(e.input.data, out, bytes);
  }
  finishEntry(entries, it, release_, allocErr);
}

void Executor::runBroadcast(const Response& r, EntryTable& entries, bool fromPayload) {
  auto it = entries.find(r.name);
  void* buf;
  if (it != entries.end()) {
    Entry& e = it->second;
    buf = e.output.data;
    if (comm_.rank() == r.root && e.output.data != e.input.data && r.bytes())
      std::memcpy(e.output.data, e.input.data, r.bytes());
  } else {  // joined: receive and discard
    scratch_.resize(std::max<size_t>(r.bytes(), 1));
    buf = scratch_.data();
  }
  if (!fromPayload) comm_.broadcast(buf, r.bytes(), r.root);
  else if (comm_.rank() != r.root && r.bytes())
    std::memcpy(buf, comm_.negotiationPayload()->payloadOf(r.root), r.bytes());
  if (it != entries.end()) finishEntry(entries, it, release_);
}

void Executor::runAlltoall(const Response& r, EntryTable& entries, bool fromPayload) {
  auto it = entries.find(r.name);
  const int n = comm_.size();
  const int me = comm_.rank();
  const size_t rb = rowBytes(r);
  AlltoallPlan plan = alltoallPlan(r, n, me, rb);
  const auto& [sendBytes, recvBytes, received, rows] = plan;
  size_t largest = 0;  // every rank computes it from the same splits
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k)
      if (j != k) largest = std::max(largest, static_cast<size_t>(r.splits[j][k]) * rb);
  if (it == entries.end()) {  // joined: sends nothing, discards what it is sent
    if (fromPayload) return;
    scratch_.resize(std::max<size_t>(static_cast<size_t>(rows) * rb, 1));
    comm_.alltoallv(scratch_.data(), sendBytes, scratch_.data(), recvBytes, largest);
    return;
  }
  Entry& e = it->second;
  Shape outShape = tailOf(r.shape);
  outShape.insert(outShape.begin(), rows);
  std::exception_ptr allocErr;
  void* out = allocateOutput(e, outShape, &allocErr);
  if (fromPayload) {
    char* to = static_cast<char*>(out);
    for (int j = 0; j < n; to += recvBytes[j], ++j) {
      size_t at = 0;  // where j's piece for me starts in j's input
      for (int k = 0; k < me; ++k) at += static_cast<size_t>(r.splits[j][k]) * rb;
      if (recvBytes[j]) std::memcpy(to, sent(j, e.input.data) + at, recvBytes[j]);
    }
  } else {
    comm_.alltoallv(e.input.data, sendBytes, out, recvBytes, largest);
  }
  e.work->receivedSplits = received;
  finishEntry(entries, it, release_, allocErr);
}

void Executor::runReducescatter(const Response& r, EntryTable& entries, bool fromPayload) {
  auto it = entries.find(r.name);
  const int n = comm_.size();
  const int64_t rowsTotal = r.shape[0];
  const int64_t rowElems = numElements(tailOf(r.shape));
  // Horovod's split: the first (rows % n) ranks get one extra row.
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) {
    int64_t rows = rowsTotal / n + (i < rowsTotal % n ? 1 : 0);
    counts[i] = static_cast<size_t>(rows * rowElems);
  }
  const size_t total = static_cast<size_t>(numElements(r.shape));
  const size_t esize = dtypeSize(r.dtype);
  if (it == entries.end()) {  // joined: contributes zeros, discards its block
    if (fromPayload) return;
    scratch_.assign(std::max<size_t>(total * esize, 1), 0);
    joinedOut_.resize(std::max<size_t>(counts[comm_.rank()] * esize, 1));
    const double fold = foldedScale(r, n);
    if (fold) comm_.reducescatterScaled(scratch_.data(), joinedOut_.data(), counts, r.dtype, r.op, fold);
    else comm_.reducescatter(scratch_.data(), joinedOut_.data(), counts, r.dtype, r.op);
    return;
  }
  Entry& e = it->second;
  // The transport reads the input itself when it only reads and nothing scales it.
  void* in = e.input.data;
  if (r.prescale != 1.0 || !comm_.traits().reducescatterReadsOnly) {
    if (scratch_.size() < total * esize) scratch_.resize(total * esize);
    scaleCopy(r.dtype, scratch_.data(), e.input.data, total, r.prescale);
    in = scratch_.data();
  }
  Shape outShape = tailOf(r.shape);
  outShape.insert(outShape.begin(), static_cast<int64_t>(counts[comm_.rank()] / std::max<int64_t>(rowElems, 1)));
  if (rowElems == 0) outShape[0] = rowsTotal / n + (comm_.rank() < rowsTotal % n ? 1 : 0);
  std::exception_ptr allocErr;
  void* out = allocateOutput(e, outShape, &allocErr);
  const double fold = foldedScale(r, n);  // as in runAllreduce
  if (fromPayload) {  // (unprescaled: the payload is the input itself)
    size_t at = 0;
    for (int j = 0; j < comm_.rank(); ++j) at += counts[j];
    reduceMany(r.dtype, r.op, out, sentInputs(e.input.data, at * esize), n, counts[comm_.rank()], fold ? fold : 1.0);
  } else if (fold) {
    comm_.reducescatterScaled(in, out, counts, r.dtype, r.op, fold);
  } else {
    comm_.reducescatter(in, out, counts, r.dtype, r.op);
  }
  if (!fold) postProcess(r, out, counts[comm_.rank()], n);
  finishEntry(entries, it, release_, allocErr);
}

void Executor::runSimple(const Response& r, EntryTable& entries) {
  if (r.type == OpType::kBarrier) comm_.barrier();
  auto it = entries.find(r.name);
  if (it == entries.end()) return;
  if (r.type == OpType::kJoin) it->second.work->joinResult = r.lastJoined;
  finishEntry(entries, it, release_);
}

}  // namespace chorus
