// The executor's order of work: ready ops by priority, large allreduces in
// chunks with a negotiation between two chunks, so that an op of higher
// priority that became ready meanwhile does not wait for all of a large one.
#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>

#include "core/executor.h"
#include "core/executor_ops.h"

namespace chorus {

namespace {
// Opens the op spans of the n responses one collective carries (at(i): the ith).
template <typename At>
void startSpans(Timeline* t, size_t n, const At& at, const char* transport, int32_t set) {
  for (size_t i = 0; i < n; ++i) {
    const Response& r = at(i);
    t->opStart(r.name, r.type, OpSpanArgs{r.bytes(), r.dtype, r.priority, set, transport, n});
  }
}

// The op spans of the responses one collective runs, in the timeline, and its
// count, bytes and time in the executor's statistics.
class OpSpans {
 public:
  OpSpans(Executor& ex, Timeline* t, const Response* const* rs, size_t n, const char* transport, int32_t set)
      : ex_(ex), t_(t && t->active() ? t : nullptr), log_(ex.listeningLog()), rs_(rs), n_(n),
        transport_(transport), start_(std::chrono::steady_clock::now()) {
    if (t_) startSpans(t_, n_, [&](size_t i) -> const Response& { return *rs_[i]; }, transport, set);
    if (log_) log_->begin();
  }
  ~OpSpans() {
    for (size_t i = 0; t_ && i < n_; ++i) t_->opEnd(rs_[i]->name);
    size_t bytes = 0;
    for (size_t i = 0; i < n_; ++i) bytes += rs_[i]->bytes();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ex_.tally(rs_[0]->type, transport_, n_, bytes, seconds);
    if (!log_) return;
    if (std::uncaught_exceptions() == 0)  // (a failed op is not a completed one)
      for (size_t i = 0; i < n_; ++i) ex_.recordOp(*rs_[i], seconds);
    log_->end();
  }

 private:
  Executor& ex_;
  Timeline* t_;
  OpLog* log_;  // the op log, when it listened as the collective began
  const Response* const* rs_;
  size_t n_;
  const char* transport_;  // a transport's static name
  std::chrono::steady_clock::time_point start_;
};

bool byPriority(const Response& a, const Response& b) { return a.priority > b.priority; }
}  // namespace

const char* Executor::transportOf(bool fromPayload) const {
  return fromPayload ? "INLINE" : comm_.traits().transport;
}

int32_t Executor::queuedPriority() const {
  int32_t p = INT_MIN;
  if (!queue_.empty()) p = queue_.front().priority;
  if (!chunked_.empty()) p = std::max(p, chunked_.back().priority());
  return p;
}

void Executor::drop() {
  queue_.clear();
  chunked_.clear();
  busy_ = false;
}

void Executor::execute(const Response* responses, size_t count, EntryTable& entries, bool fromPayload,
                       bool holdChunks) {
  size_t spent = 0;
  if (fromPayload && count > 0) {  // ahead of everything (see the header)
    runSome(responses, 1, entries, true, &spent, SIZE_MAX);
    ++responses;
    --count;
    spent = 0;
  }
  const size_t budget = chunkBytes_ > 0 ? static_cast<size_t>(chunkBytes_) : SIZE_MAX;
  if (queue_.empty() && chunked_.empty()) {
    // Nothing waits: run from the caller's array, copy only what is left.
    const size_t taken = runSome(responses, count, entries, false, &spent, budget);
    queue_.assign(responses + taken, responses + count);
  } else {
    mergeQueue(responses, count);
    bool preempted = fromPayload || holdChunks;  // (a payload op went first)
    while (spent < budget) {
      if (!chunked_.empty() && (queue_.empty() || queue_.front().priority <= chunked_.back().priority())) {
        // After ops that went ahead of it, the chunk waits for the next call:
        // whoever waits for them (a caller driving this cycle) has them now.
        if (preempted) break;
        runChunk(entries, &spent);
        continue;
      }
      preempted = !chunked_.empty();
      if (queue_.empty()) break;
      // Only what outranks the chunked op under way goes before its next chunk.
      size_t ahead = queue_.size();
      if (!chunked_.empty()) {
        const int32_t p = chunked_.back().priority();
        ahead = static_cast<size_t>(std::find_if(queue_.begin(), queue_.end(),
                                                 [p](const Response& r) { return r.priority <= p; }) -
                                    queue_.begin());
      }
      const size_t taken = runSome(queue_.data(), ahead, entries, false, &spent, budget);
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(taken));
    }
  }
  busy_ = !queue_.empty() || !chunked_.empty();
}

// Stable: among equal priorities, what was queued first stays first.
void Executor::mergeQueue(const Response* responses, size_t count) {
  if (count == 0) return;
  merged_.clear();
  std::merge(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()), responses,
             responses + count, std::back_inserter(merged_), byPriority);
  queue_.swap(merged_);
}

size_t Executor::groupAt(const Response* src, size_t count, size_t i) {
  size_t bytes = src[i].bytes();
  size_t j = i + 1;
  const int64_t threshold = fusionThreshold();
  while (threshold > 0 && j < count && fusible(src[i], src[j]) &&
         bytes + src[j].bytes() <= static_cast<size_t>(threshold)) {
    bytes += src[j].bytes();
    ++j;
  }
  return j;
}

size_t Executor::takeGroup(const Response* src, size_t i, size_t j) {
  group_.clear();
  size_t bytes = 0;
  for (size_t k = i; k < j; ++k) {
    group_.push_back(&src[k]);
    bytes += src[k].bytes();
  }
  return bytes;
}

size_t Executor::runSome(const Response* src, size_t count, EntryTable& entries, bool fromPayload, size_t* spent,
                         size_t budget) {
  size_t i = 0;
  while (i < count && *spent < budget) {
    progressed();
    const Response& r = src[i];
    if (r.errorKind != ErrorKind::kNone) {
      fail(r, entries);
      ++i;
      continue;
    }
    if (r.onDevice) {  // CUDA tensors (no barrier or join has any): whole, on the set's device path
      DeviceRunner& dev = device(r, entries);
      const size_t j = r.type == OpType::kAllreduce ? groupAt(src, count, i) : i + 1;
      const size_t bytes = takeGroup(src, i, j);
      OpSpans spans(*this, timeline_, group_.data(), group_.size(), dev.transport(), setId_);
      if (r.type == OpType::kAllreduce) {
        ++batches_;
        tensors_ += static_cast<int64_t>(group_.size());
        dev.allreduce(group_.data(), group_.size(), entries, release_);
      } else {
        dev.run(r, entries, release_);
      }
      *spent += bytes;
      i = j;
      continue;
    }
    if (r.type == OpType::kAllreduce) {
      const size_t j = groupAt(src, count, i);
      const size_t bytes = takeGroup(src, i, j);
      std::vector<const Response*>& group = group_;
      if (!fromPayload && chunkBytes_ > 0 && r.op != ReduceOp::kAdasum && bytes > static_cast<size_t>(chunkBytes_)) {
        startChunked(src + i, j - i, entries);
        runChunk(entries, spent);
        return j;
      }
      {
        OpSpans spans(*this, timeline_, group.data(), group.size(), transportOf(fromPayload), setId_);
        runAllreduce(group, entries, fromPayload);
      }
      *spent += bytes;
      i = j;
      continue;
    }
    const Response* one = &r;
    OpSpans spans(*this, timeline_, &one, 1, transportOf(fromPayload), setId_);
    switch (r.type) {
      case OpType::kAllreduce: break;
      case OpType::kAllgather: runAllgather(r, entries, fromPayload); break;
      case OpType::kBroadcast: runBroadcast(r, entries, fromPayload); break;
      case OpType::kAlltoall: runAlltoall(r, entries, fromPayload); break;
      case OpType::kReducescatter: runReducescatter(r, entries, fromPayload); break;
      case OpType::kBarrier:
      case OpType::kJoin: runSimple(r, entries); break;
    }
    *spent += r.bytes();
    ++i;
  }
  return i;
}

DeviceRunner& Executor::device(const Response& r, EntryTable& entries) {
  // This rank's device for the set: its tensor's (a rank that joined: the current one).
  auto it = entries.find(r.name);
  const int ordinal = it != entries.end() ? it->second.input.device : -1;
  if (device_) {
    // The set's communicator and streams are on one device per rank (as NCCL's are).
    if (ordinal >= 0 && ordinal != device_->ordinal())
      throw InvalidArgument("'" + r.name + "': process set " + std::to_string(setId_) + " runs this rank's CUDA ops on cuda:" +
                            std::to_string(device_->ordinal()) + ", this tensor is on cuda:" + std::to_string(ordinal) +
                            " (one device per rank and process set)");
    return *device_;
  }
  if (!deviceSettings_.backend) throw Error("CUDA tensors reached a process set with no device settings");
  auto runner = std::make_unique<DeviceRunner>(deviceSettings_, ordinal, comm_, timeline_, setId_);
  std::lock_guard<std::mutex> lock(deviceMu_);
  device_ = std::move(runner);
  return *device_;
}

std::string Executor::gpuPath() const {
  std::lock_guard<std::mutex> lock(deviceMu_);
  return device_ ? device_->transport() : "";
}

std::string Executor::gpuPathReason() const {
  std::lock_guard<std::mutex> lock(deviceMu_);
  return device_ ? device_->reason() : "";
}

void Executor::abortDevice() {
  std::lock_guard<std::mutex> lock(deviceMu_);
  if (device_) device_->abort();
}

void Executor::tally(OpType type, const char* path, size_t tensors, size_t bytes, double seconds, bool counts) {
  std::lock_guard<std::mutex> lock(tallyMu_);
  auto it = std::find_if(tallies_.begin(), tallies_.end(),
                         [&](const auto& row) { return row.first == type && row.second.path == path; });
  if (it == tallies_.end()) {
    tallies_.push_back({type, OpStat{}});
    it = tallies_.end() - 1;
    it->second.op = opTypeName(type);
    it->second.path = path;
  }
  OpStat& t = it->second;
  if (counts) ++t.count;
  t.tensors += static_cast<int64_t>(tensors);
  t.bytes += static_cast<int64_t>(bytes);
  t.seconds += seconds;
}

void Executor::recordOp(const Response& r, double seconds) {
  if (!opLog_ || !opLog_->on()) return;
  opLog_->add(OpRecord{opTypeName(r.type), static_cast<int64_t>(r.bytes()), seconds, comm_.size(), setId_});
}

std::vector<OpStat> Executor::opStats() const {
  std::vector<std::pair<OpType, OpStat>> rows;
  {
    std::lock_guard<std::mutex> lock(tallyMu_);
    rows = tallies_;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.path < b.second.path;
  });
  std::vector<OpStat> out;
  for (auto& row : rows) out.push_back(std::move(row.second));
  return out;
}

void Executor::startChunked(const Response* group, size_t n, EntryTable& entries) {
  ++batches_;
  tensors_ += static_cast<int64_t>(n);
  {
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += group[i].bytes();
    tally(OpType::kAllreduce, transportOf(false), n, bytes, 0.0);  // its chunks add their time
  }
  chunked_.emplace_back();
  Chunked& c = chunked_.back();
  c.started = std::chrono::steady_clock::now();
  c.group.assign(group, group + n);
  std::vector<const Response*> ptrs;
  for (const Response& r : c.group) ptrs.push_back(&r);
  buildSpans(ptrs.data(), n, entries, c.spans, c.zeros);
  for (const Span& s : c.spans) c.ends.push_back(c.total += s.count);
  if (timeline_ && timeline_->active())
    startSpans(timeline_, n, [&](size_t i) -> const Response& { return c.group[i]; }, transportOf(false), setId_);
}

// The next chunk of the latest chunked group: every span's part in
// [done, done + chunk) elements; the tensors that end in it complete.
void Executor::runChunk(EntryTable& entries, size_t* spent) {
  progressed();
  const auto started = std::chrono::steady_clock::now();
  struct AddTime {  // this chunk's time goes to its allreduce's tally
    Executor* ex;
    std::chrono::steady_clock::time_point t0;
    ~AddTime() {
      ex->tally(OpType::kAllreduce, ex->transportOf(false), 0, 0,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), false);
    }
  } addTime{this, started};
  Chunked& c = chunked_.back();
  const Response& head = c.group.front();
  const size_t esize = dtypeSize(head.dtype);
  const size_t from = c.done;
  const size_t per = chunkBytes_ > 0 ? std::max<size_t>(1, static_cast<size_t>(chunkBytes_) / esize) : c.total;
  const size_t to = std::min(c.total, from + per);
  std::vector<Span>& pieces = chunkSpans_;
  pieces.clear();
  size_t at = 0;
  for (const Span& s : c.spans) {
    const size_t lo = std::max(at, from), hi = std::min(at + s.count, to);
    if (lo < hi) {
      const size_t off = (lo - at) * esize;
      pieces.push_back({static_cast<char*>(s.data) + off, hi - lo,
                        s.src ? static_cast<const char*>(s.src) + off : nullptr});
    }
    at += s.count;
    if (at >= to) break;
  }
  const double fold = foldedScale(head, comm_.size());
  if (fold) comm_.allreduceSpansScaled(pieces, head.dtype, head.op, fold);
  else comm_.allreduceSpans(pieces, head.dtype, head.op);
  if (!fold)
    for (const Span& p : pieces) postProcess(head, p.data, p.count, comm_.size());
  c.done = to;
  *spent += (to - from) * esize;
  while (c.finished < c.group.size() && c.ends[c.finished] <= to) {
    const std::string& name = c.group[c.finished].name;
    if (timeline_ && timeline_->active()) timeline_->opEnd(name);
    recordOp(c.group[c.finished],
             std::chrono::duration<double>(std::chrono::steady_clock::now() - c.started).count());
    auto it = entries.find(name);
    if (it != entries.end()) finishEntry(entries, it, release_);
    ++c.finished;
  }
  if (c.finished == c.group.size()) chunked_.pop_back();
}

}  // namespace chorus
