#include "core/executor_device.h"

#include <cstring>

#include "chorus/error.h"
#include "core/executor.h"
#include "core/executor_ops.h"

namespace chorus {

namespace {

Shape tailOf(const Shape& s) { return s.empty() ? Shape{} : Shape(s.begin() + 1, s.end()); }

// A scope of the timeline's activity inside an op's span (Horovod's names).
class Activity {
 public:
  Activity(Timeline* t, const std::string& name, const char* what) : t_(t && t->active() ? t : nullptr), name_(name) {
    if (t_) t_->activityStart(name_, what);
  }
  ~Activity() {
    if (t_) t_->activityEnd(name_);
  }

 private:
  Timeline* t_;
  const std::string& name_;
};

// Postscale, then Average's division, on the device (what the path did not fold in).
void postProcessOn(DeviceBackend& b, const Response& r, void* buf, size_t n, int size, void* stream) {
  if (r.postscale != 1.0) b.scale(r.dtype, buf, buf, n, r.postscale, stream);
  if (r.op == ReduceOp::kAverage) b.divide(r.dtype, buf, n, size, stream);
}

}  // namespace

DeviceRunner::DeviceRunner(const DeviceSettings& s, int ordinal, Communicator& cpu, Timeline* timeline, int32_t setId)
    : b_(s.backend()),
      ordinal_(ordinal >= 0 ? ordinal : b_->current()),
      cpu_(cpu),
      timeline_(timeline),
      setId_(setId),
      stream_(b_, ordinal_),
      path_(makeDevicePath(b_, ordinal_, cpu, s.host, s.path, &why_)),
      fusion_(b_, ordinal_),
      joined_(b_, ordinal_) {}

DeviceRunner::~DeviceRunner() {
  try {
    b_->synchronizeStream(stream_.get());
  } catch (...) {
  }
}

void DeviceRunner::waitReady(const Entry& e) {
  if (e.ready) b_->streamWait(stream_.get(), e.ready->get());
}

void* DeviceRunner::output(Entry& e, const Shape& shape, std::exception_ptr* err) {
  auto b = b_;
  const int ordinal = ordinal_;
  return allocateOutput(  // chorus's own storage is device memory, freed with the Work
      e, shape, err,
      [b, ordinal](size_t bytes) {
        return std::shared_ptr<void>(b->allocDevice(ordinal, bytes), [b](void* q) {
          try {
            b->freeDevice(q);
          } catch (...) {
          }
        });
      },
      ordinal_);
}

void DeviceRunner::finish(EntryTable& entries, EntryTable::iterator it, const Release& release,
                          std::exception_ptr err) {
  WorkState& w = *it->second.work;
  if (!w.deviceDone) w.deviceDone = std::make_shared<DeviceEvent>(b_, ordinal_);
  b_->record(w.deviceDone->get(), stream_.get());
  finishEntry(entries, it, release, err);
}

void DeviceRunner::allreduce(const Response* const* group, size_t n, EntryTable& entries, const Release& release) {
  const Response& head = *group[0];
  const int size = cpu_.size();
  const double fold = foldedScale(head, size);
  const size_t esize = dtypeSize(head.dtype);
  size_t total = 0, present = 0;
  for (size_t i = 0; i < n; ++i) {
    total += static_cast<size_t>(numElements(group[i]->shape));
    present += entries.count(group[i]->name);
  }
  void* s = stream_.get();
  CurrentDevice on(*b_, ordinal_);
  if (present == 0) {  // joined: zeros, in the same calls as the others
    path_->allreduceJoined(total, head.dtype, head.op, fold ? fold : 1.0, s);
    return;
  }
  if (present != n) throw Error("device allreduce: a fused group holds tensors this rank did not submit");
  for (size_t i = 0; i < n; ++i) {  // (fused with the first: each must be on the set's device too)
    const int d = entries.at(group[i]->name).input.device;
    if (d != ordinal_)
      throw InvalidArgument("'" + group[i]->name + "': process set " + std::to_string(setId_) +
                            " runs this rank's CUDA ops on cuda:" + std::to_string(ordinal_) + ", this tensor is on cuda:" +
                            std::to_string(d) + " (one device per rank and process set)");
  }
  {
    Activity a(timeline_, head.name, "WAIT_FOR_DATA");
    for (size_t i = 0; i < n; ++i) waitReady(entries.at(group[i]->name));
  }
  void* buf;
  if (n == 1) {  // in place on the output: no fusion buffer
    Entry& e = entries.at(head.name);
    buf = e.output.data;
    const void* in = e.input.data;
    if (head.prescale != 1.0) {
      b_->scale(head.dtype, buf, in, total, head.prescale, s);
      in = buf;
    }
    path_->allreduce(buf, in, total, head.dtype, head.op, fold ? fold : 1.0, s);
  } else {
    buf = fusion_.reserve(std::max<size_t>(total * esize, 1));
    std::vector<CopyItem> items;
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const Entry& e = entries.at(group[i]->name);
      items.push_back({static_cast<char*>(buf) + at, e.input.data, group[i]->bytes()});
      at += group[i]->bytes();
    }
    {
      Activity a(timeline_, head.name, "MEMCPY_IN_FUSION_BUFFER");
      b_->batchedCopy(items.data(), items.size(), s);
      if (head.prescale != 1.0) b_->scale(head.dtype, buf, buf, total, head.prescale, s);
    }
    path_->allreduce(buf, buf, total, head.dtype, head.op, fold ? fold : 1.0, s);
    for (CopyItem& c : items) {
      const void* from = c.dst;
      c.dst = entries.at(group[&c - items.data()]->name).output.data;
      c.src = from;
    }
    Activity a(timeline_, head.name, "MEMCPY_OUT_FUSION_BUFFER");
    b_->batchedCopy(items.data(), items.size(), s);
  }
  for (size_t i = 0; i < n; ++i) {
    auto it = entries.find(group[i]->name);
    if (!fold) postProcessOn(*b_, head, it->second.output.data, static_cast<size_t>(numElements(group[i]->shape)),
                             size, s);
    finish(entries, it, release);
  }
}

void DeviceRunner::run(const Response& r, EntryTable& entries, const Release& release) {
  auto it = entries.find(r.name);
  const bool joined = it == entries.end();
  Entry* e = joined ? nullptr : &it->second;
  if (e) waitReady(*e);
  const int n = cpu_.size(), me = cpu_.rank();
  const size_t rb = static_cast<size_t>(numElements(tailOf(r.shape))) * dtypeSize(r.dtype);
  void* s = stream_.get();
  CurrentDevice on(*b_, ordinal_);
  std::exception_ptr allocErr;
  switch (r.type) {
    case OpType::kAllgather: {
      std::vector<size_t> bytes(n);
      int64_t rows = 0;
      for (int i = 0; i < n; ++i) {
        bytes[i] = static_cast<size_t>(r.rows[i]) * rb;
        rows += r.rows[i];
      }
      Shape shape = tailOf(r.shape);
      shape.insert(shape.begin(), rows);
      if (joined) {
        void* z = joined_.zeroed(static_cast<size_t>(rows) * rb, s);
        path_->allgatherv(z, z, bytes, s);
        return;
      }
      path_->allgatherv(e->input.data, output(*e, shape, &allocErr), bytes, s);
      break;
    }
    case OpType::kBroadcast: {
      if (joined) return path_->broadcast(joined_.zeroed(r.bytes(), s), r.bytes(), r.root, s);
      if (me == r.root && e->output.data != e->input.data) b_->copy(e->output.data, e->input.data, r.bytes(), s);
      path_->broadcast(e->output.data, r.bytes(), r.root, s);
      break;
    }
    case OpType::kAlltoall: {
      const AlltoallPlan plan = alltoallPlan(r, n, me, rb);
      const auto& [sendBytes, recvBytes, received, rows] = plan;
      if (joined) {
        void* z = joined_.zeroed(static_cast<size_t>(rows) * rb, s);
        path_->alltoallv(z, sendBytes, z, recvBytes, s);
        return;
      }
      Shape shape = tailOf(r.shape);
      shape.insert(shape.begin(), rows);
      path_->alltoallv(e->input.data, sendBytes, output(*e, shape, &allocErr), recvBytes, s);
      e->work->receivedSplits = received;
      break;
    }
    case OpType::kReducescatter: {
      const int64_t rowsTotal = r.shape[0];
      const int64_t rowElems = numElements(tailOf(r.shape));
      std::vector<size_t> counts(n);
      for (int i = 0; i < n; ++i)
        counts[i] = static_cast<size_t>((rowsTotal / n + (i < rowsTotal % n ? 1 : 0)) * rowElems);
      const size_t total = static_cast<size_t>(numElements(r.shape));
      const double fold = foldedScale(r, n);
      Shape shape = tailOf(r.shape);
      shape.insert(shape.begin(), rowsTotal / n + (me < rowsTotal % n ? 1 : 0));
      if (joined) {
        void* z = joined_.zeroed(total * dtypeSize(r.dtype), s);
        path_->reducescatter(z, z, counts, r.dtype, r.op, fold ? fold : 1.0, s);
        return;
      }
      const void* in = e->input.data;
      if (r.prescale != 1.0) {
        void* f = fusion_.reserve(std::max<size_t>(total * dtypeSize(r.dtype), 1));
        b_->scale(r.dtype, f, in, total, r.prescale, s);
        in = f;
      }
      void* out = output(*e, shape, &allocErr);
      path_->reducescatter(in, out, counts, r.dtype, r.op, fold ? fold : 1.0, s);
      if (!fold) postProcessOn(*b_, r, out, counts[me], n, s);
      break;
    }
    default: throw Error(std::string("device path: unexpected ") + opTypeName(r.type));
  }
  finish(entries, it, release, allocErr);
}

}  // namespace chorus
