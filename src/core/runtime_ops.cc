// The collectives: validate the caller's tensors, build requests, enqueue.
#include <chrono>
#include <functional>
#include <numeric>
#include <optional>

#include "chorus/error.h"
#include "core/runtime_impl.h"
#include "reduce/reduce.h"

namespace chorus {

namespace {

// Set while a synchronous call submits its op: the calling thread waits at once
// and runs the cycle itself (see CycleDriver), so the controller is not woken.
thread_local bool tlsWaitsAtOnce = false;
// The op such a call registered as waited for at once (see RuntimeImpl::submit).
thread_local std::shared_ptr<WorkState> tlsEntered;

// Drops the registration of an op that will not be waited for at once (any but
// keep), so that it cannot keep the set's thread out of the cycles.
void releaseEntered(const WorkState* keep) {
  std::shared_ptr<WorkState> e = std::move(tlsEntered);
  tlsEntered = nullptr;
  if (e && e.get() != keep && e->driverEntered.exchange(false)) e->driver->leave();
}

Entry makeEntry(Request req, const Tensor& input, const Tensor& output,
                const std::shared_ptr<WorkState>& work, size_t part, Allocator alloc = nullptr) {
  Entry e;
  e.req = std::move(req);
  e.input = input;
  e.output = output;
  e.alloc = std::move(alloc);
  e.work = work;
  e.part = part;
  e.enqueued = std::chrono::steady_clock::now();
  return e;
}

// Names an op in error messages; the text is built only when there is an error.
struct OpWhere {
  const char* kind;
  const std::string& name;
  std::string str() const { return std::string(kind) + " '" + name + "'"; }
};

void checkTensor(const Tensor& t, const OpWhere& where) {
  for (int64_t d : t.shape) {
    if (d < 0) throw InvalidArgument(where.str() + " input: negative dimension in shape " + shapeString(t.shape));
  }
  if (!t.data && t.numel() > 0) throw InvalidArgument(where.str() + " input: data pointer is null");
  dtypeSize(t.dtype);  // throws on an unknown dtype code
}

void checkSameLayout(const Tensor& in, const Tensor& out, const OpWhere& where) {
  if (in.dtype != out.dtype || in.shape != out.shape) {
    throw InvalidArgument(where.str() + ": output (" + dtypeName(out.dtype) + " " + shapeString(out.shape) +
                          ") must match input (" + dtypeName(in.dtype) + " " + shapeString(in.shape) + ")");
  }
}

void checkReduceOp(ReduceOp op, const std::string& what, bool sumOrAverageOnly) {
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::kAdasum))
    throw InvalidArgument(what + ": unknown reduce op");
  if (sumOrAverageOnly && op != ReduceOp::kSum && op != ReduceOp::kAverage)
    throw InvalidArgument(what + ": reducescatter supports Sum and Average, not " + reduceOpName(op));
}

// The tensors of a call, one or a group, seen without copying them into a vector.
struct TensorList {
  TensorList(const std::vector<Tensor>& v) : first(v.data()), count(v.size()) {}
  TensorList(const Tensor& t) : first(&t), count(1) {}
  size_t size() const { return count; }
  const Tensor& operator[](size_t i) const { return first[i]; }
  const Tensor* first;
  size_t count;
};

// CUDA tensors: checks that a call's tensors share a device and records one
// ready event on the caller's stream (null for host tensors).
std::shared_ptr<DeviceEvent> readyEvent(RuntimeImpl& impl, TensorList inputs, const TensorList* outputs,
                                        const OpOptions& opts, const char* kind, const std::string& name) {
  const int32_t dev = inputs.size() ? inputs[0].device : kHostDevice;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool outDiffers = outputs && (*outputs)[i].device != inputs[i].device;
    if (inputs[i].device != dev || outDiffers)
      throw InvalidArgument(std::string(kind) + " '" + name + "': tensor " + std::to_string(i) + " is on " +
                            deviceName(outDiffers ? (*outputs)[i].device : inputs[i].device) + ", tensor 0's input on " +
                            deviceName(dev) + ": one call's tensors must share a device");
  }
  if (dev < 0) return nullptr;
  auto backend = impl.deviceBackend();  // (throws saying what is missing)
  CurrentDevice on(*backend, dev);  // (a null stream is the current device's default stream)
  // A CUDA tensor's memory is that device's (a host pointer here would reach NCCL).
  auto check = [&](const Tensor& t, size_t i, const char* which) {
    if (t.numel() <= 0) return;
    const int where = backend->deviceOf(t.data);
    if (where != dev)
      throw InvalidArgument(std::string(kind) + " '" + name + "': " + which + " " + std::to_string(i) +
                            " is said to be on " + deviceName(dev) + " but its memory is " +
                            (where < 0 ? std::string("host memory") : deviceName(where)));
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    check(inputs[i], i, "tensor");
    if (outputs) check((*outputs)[i], i, "output");
  }
  auto ready = std::make_shared<DeviceEvent>(backend, dev);
  backend->record(ready->get(), opts.stream);
  return ready;
}

// One request per tensor of a (possibly grouped) call, submitted together.
// fill() sets the op-specific fields of each request.
Work submitGroup(RuntimeImpl& impl, OpType type, const char* kind, const char* groupedKind,
                 TensorList inputs, const TensorList* outputs, const OpOptions& opts,
                 const std::function<void(Request&)>& fill, const Allocator& alloc) {
  impl.requireInit();
  auto controller = impl.sets.controllerFor(opts.processSet, impl.rank);  // (throws for a non-member first)
  if (outputs && outputs->size() != inputs.size()) {
    throw InvalidArgument(std::string(groupedKind) + ": " + std::to_string(inputs.size()) + " inputs but " +
                          std::to_string(outputs->size()) + " outputs");
  }
  const bool grouped = inputs.size() > 1;
  std::string base = impl.resolveName(opts, grouped ? groupedKind : kind);
  const int32_t dev = inputs.size() ? inputs[0].device : kHostDevice;
  if (dev >= 0 && type == OpType::kAllreduce) {
    Request q;
    fill(q);
    if (q.op == ReduceOp::kAdasum)
      throw InvalidArgument(std::string(kind) + " '" + base + "': Adasum is not supported on CUDA tensors");
  }
  std::shared_ptr<DeviceEvent> ready = readyEvent(impl, inputs, outputs, opts, grouped ? groupedKind : kind, base);
  auto work = std::make_shared<WorkState>(inputs.size());
  std::vector<Entry> entries;
  entries.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Request q;
    q.name = grouped ? base + "." + std::to_string(i) : std::move(base);  // (one tensor: base is done with)
    const OpWhere where{kind, q.name};
    checkTensor(inputs[i], where);
    if (outputs) {
      checkSameLayout(inputs[i], (*outputs)[i], where);  // (the Work's outputs are set as each completes)
    } else if (inputs[i].shape.empty() && type != OpType::kAllgather) {
      throw InvalidArgument(where.str() + ": input needs at least one dimension");
    }
    q.type = type;
    q.dtype = inputs[i].dtype;
    q.shape = inputs[i].shape;
    q.priority = opts.priority;
    if (grouped) {
      q.group = base;
      q.groupSize = static_cast<int32_t>(inputs.size());
    }
    fill(q);
    q.device = dev;
    static const Tensor kNoOutput;  // (an lvalue on both sides of ?: : no copy of the output)
    entries.push_back(makeEntry(std::move(q), inputs[i], outputs ? (*outputs)[i] : kNoOutput, work, i, alloc));
    entries.back().ready = ready;
  }
  if (entries.empty()) {
    work->complete(nullptr);
    return Work(work);
  }
  return impl.submit(std::move(controller), std::move(entries), work);
}

}  // namespace

std::string RuntimeImpl::autoName(int32_t setId, const char* kind) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key = std::to_string(setId) + "/" + kind;
  // The set is part of the name: a name may be in flight on one set at a time.
  const std::string set = setId == kGlobalProcessSetId ? "" : "set" + std::to_string(setId) + ".";
  return std::string(kind) + ".noname." + set + std::to_string(++counters_[key]);
}

std::string Runtime::uniqueName(int32_t processSet, const std::string& kind) {
  return impl_->autoName(processSet, kind.c_str());
}

std::string RuntimeImpl::resolveName(const OpOptions& opts, const char* kind) {
  return opts.name.empty() ? autoName(opts.processSet, kind) : opts.name;
}

Work RuntimeImpl::submit(int32_t setId, std::vector<Entry> entries, std::shared_ptr<WorkState> work) {
  return submit(sets.controllerFor(setId, rank), std::move(entries), std::move(work));
}

Work RuntimeImpl::submit(std::shared_ptr<Controller> controller, std::vector<Entry> entries,
                         std::shared_ptr<WorkState> work) {
  work->driver = controller->driver();
  // A caller that waits at once keeps the controller thread out of its cycles from now on.
  const bool atOnce = tlsWaitsAtOnce;
  if (atOnce) {
    tlsWaitsAtOnce = false;  // only the first op of the call
    work->driver->enter();
    work->driverEntered = true;
    tlsEntered = work;
  }
  try {
    controller->enqueue(std::move(entries), !atOnce);
  } catch (...) {
    if (atOnce) releaseEntered(nullptr);
    throw;
  }
  // A call that waits at once has its op done when it returns: synchronize()
  // need not know of it.
  if (atOnce) return Work(std::move(work));
  track(work);
  return Work(std::move(work));
}

void RuntimeImpl::track(const std::shared_ptr<WorkState>& work) {
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_.size() > 256) {
    outstanding_.remove_if([](const std::weak_ptr<WorkState>& w) {
      auto s = w.lock();
      return !s || s->done();
    });
  }
  outstanding_.push_back(work);
}

void RuntimeImpl::synchronize() {
  std::list<std::weak_ptr<WorkState>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(outstanding_);
  }
  std::exception_ptr first;
  for (auto& w : pending) {
    if (auto s = w.lock()) {
      try {
        s->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
  }
  if (first) std::rethrow_exception(first);
}

namespace {

Work submitAllreduce(RuntimeImpl& impl, TensorList inputs, TensorList outputs, const AllreduceOptions& opts) {
  checkReduceOp(opts.op, "allreduce", false);
  return submitGroup(impl, OpType::kAllreduce, "allreduce", "grouped_allreduce", inputs, &outputs, opts,
                     [&](Request& q) {
                       if (opts.op == ReduceOp::kAdasum && !isFloating(q.dtype))
                         throw InvalidArgument("allreduce '" + q.name + "': Adasum needs a floating-point tensor, not " +
                                               dtypeName(q.dtype));
                       q.op = opts.op;
                       q.prescale = opts.prescaleFactor;
                       q.postscale = opts.postscaleFactor;
                     },
                     nullptr);
}

Work submitReducescatter(RuntimeImpl& impl, TensorList inputs, const ReducescatterOptions& opts,
                         const Allocator& alloc) {
  checkReduceOp(opts.op, "reducescatter", true);
  return submitGroup(impl, OpType::kReducescatter, "reducescatter", "grouped_reducescatter", inputs, nullptr, opts,
                     [&](Request& q) {
                       q.op = opts.op;
                       q.prescale = opts.prescaleFactor;
                       q.postscale = opts.postscaleFactor;
                     },
                     alloc);
}

}  // namespace

Work Runtime::groupedAllreduceAsync(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                    const AllreduceOptions& opts) {
  return submitAllreduce(*impl_, inputs, outputs, opts);
}

Work Runtime::allreduceAsync(const Tensor& input, const Tensor& output, const AllreduceOptions& opts) {
  return submitAllreduce(*impl_, input, output, opts);
}

Work Runtime::groupedAllgatherAsync(const std::vector<Tensor>& inputs, const OpOptions& opts, Allocator alloc) {
  return submitGroup(*impl_, OpType::kAllgather, "allgather", "grouped_allgather", inputs, nullptr, opts,
                     [](Request&) {}, alloc);
}

Work Runtime::allgatherAsync(const Tensor& input, const OpOptions& opts, Allocator alloc) {
  return submitGroup(*impl_, OpType::kAllgather, "allgather", "grouped_allgather", input, nullptr, opts,
                     [](Request&) {}, alloc);
}

Work Runtime::broadcastAsync(const Tensor& input, const Tensor& output, int rootRank, const OpOptions& opts) {
  impl_->requireInit();
  impl_->sets.controllerFor(opts.processSet, impl_->rank);
  ProcessSet ps = impl_->sets.get(opts.processSet);
  std::string name = impl_->resolveName(opts, "broadcast");
  checkTensor(input, {"broadcast", name});
  checkSameLayout(input, output, {"broadcast", name});
  auto it = std::find(ps.ranks().begin(), ps.ranks().end(), rootRank);
  if (it == ps.ranks().end()) {
    throw InvalidArgument("broadcast '" + name + "': root rank " + std::to_string(rootRank) +
                          " is not in process set " + std::to_string(ps.id()));
  }
  Request q;
  q.type = OpType::kBroadcast;
  q.name = name;
  q.dtype = input.dtype;
  q.shape = input.shape;
  q.root = static_cast<int32_t>(it - ps.ranks().begin());
  q.priority = opts.priority;
  q.device = input.device;
  const TensorList out(output);
  auto ready = readyEvent(*impl_, input, &out, opts, "broadcast", name);
  auto work = std::make_shared<WorkState>(1);
  std::vector<Entry> entries;
  entries.push_back(makeEntry(std::move(q), input, output, work, 0));
  entries.back().ready = std::move(ready);
  return impl_->submit(opts.processSet, std::move(entries), work);
}

Work Runtime::alltoallAsync(const Tensor& input, const std::vector<int64_t>& splits, const OpOptions& opts,
                            Allocator alloc) {
  impl_->requireInit();
  impl_->sets.controllerFor(opts.processSet, impl_->rank);
  ProcessSet ps = impl_->sets.get(opts.processSet);
  std::string name = impl_->resolveName(opts, "alltoall");
  checkTensor(input, {"alltoall", name});
  if (input.shape.empty()) throw InvalidArgument("alltoall '" + name + "': input needs at least one dimension");
  const int64_t rows = input.shape[0];
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    if (rows % ps.size() != 0) {
      throw InvalidArgument("alltoall '" + name + "': first dimension " + std::to_string(rows) +
                            " does not divide evenly among " + std::to_string(ps.size()) +
                            " ranks; pass splits");
    }
    s.assign(ps.size(), rows / ps.size());
  }
  if (static_cast<int>(s.size()) != ps.size()) {
    throw InvalidArgument("alltoall '" + name + "': " + std::to_string(s.size()) + " splits for " +
                          std::to_string(ps.size()) + " ranks");
  }
  for (int64_t v : s)
    if (v < 0) throw InvalidArgument("alltoall '" + name + "': negative split");
  if (std::accumulate(s.begin(), s.end(), int64_t{0}) != rows) {
    throw InvalidArgument("alltoall '" + name + "': splits sum to " +
                          std::to_string(std::accumulate(s.begin(), s.end(), int64_t{0})) +
                          " but the first dimension is " + std::to_string(rows));
  }
  Request q;
  q.type = OpType::kAlltoall;
  q.name = name;
  q.dtype = input.dtype;
  q.shape = input.shape;
  q.splits = s;
  q.priority = opts.priority;
  q.device = input.device;
  auto ready = readyEvent(*impl_, input, nullptr, opts, "alltoall", name);
  auto work = std::make_shared<WorkState>(1);
  std::vector<Entry> entries;
  entries.push_back(makeEntry(std::move(q), input, Tensor{}, work, 0, std::move(alloc)));
  entries.back().ready = std::move(ready);
  return impl_->submit(opts.processSet, std::move(entries), work);
}

Work Runtime::groupedReducescatterAsync(const std::vector<Tensor>& inputs, const ReducescatterOptions& opts,
                                        Allocator alloc) {
  return submitReducescatter(*impl_, inputs, opts, alloc);
}

Work Runtime::reducescatterAsync(const Tensor& input, const ReducescatterOptions& opts, Allocator alloc) {
  return submitReducescatter(*impl_, input, opts, alloc);
}

Work Runtime::barrierAsync(int32_t processSet) {
  impl_->requireInit();
  impl_->sets.controllerFor(processSet, impl_->rank);
  Request q;
  q.type = OpType::kBarrier;
  q.name = impl_->autoName(processSet, "barrier");
  auto work = std::make_shared<WorkState>(1);
  std::vector<Entry> entries;
  entries.push_back(makeEntry(std::move(q), Tensor{}, Tensor{}, work, 0));
  return impl_->submit(processSet, std::move(entries), work);
}

Work Runtime::joinAsync(int32_t processSet) {
  impl_->requireInit();
  impl_->sets.controllerFor(processSet, impl_->rank);
  Request q;
  q.type = OpType::kJoin;
  q.name = "join";
  auto work = std::make_shared<WorkState>(1);
  std::vector<Entry> entries;
  entries.push_back(makeEntry(std::move(q), Tensor{}, Tensor{}, work, 0));
  return impl_->submit(processSet, std::move(entries), work);
}

namespace {
// submitAndWait's body; the blocking calls below hand it their lambdas directly
// (a std::function of four references would allocate on every call).
template <typename Submit>
Work submitThenWait(Submit&& submit, const std::function<bool()>* interrupted = nullptr) {
  std::optional<Work> w;
  tlsWaitsAtOnce = true;
  try {
    w.emplace(submit());
  } catch (...) {
    tlsWaitsAtOnce = false;
    releaseEntered(nullptr);
    throw;
  }
  tlsWaitsAtOnce = false;
  releaseEntered(w->state().get());
  if (!w->state()->waitUnless(interrupted)) throw Interrupted(*w);
  return *w;
}
}  // namespace

Work Runtime::submitAndWait(const std::function<Work()>& submit) { return submitThenWait(submit); }
Work Runtime::submitAndWaitUnless(const std::function<Work()>& submit, const std::function<bool()>& interrupted) {
  return submitThenWait(submit, &interrupted);
}
namespace {
// The blocking forms on CUDA tensors return with opts.stream ordered after the
// op's device work (a GPU-side wait), so work the caller queues there sees it.
Work orderedOn(Work w, void* stream) {
  w.streamWait(stream);
  return w;
}
}  // namespace

void Runtime::allreduce(const Tensor& input, const Tensor& output, const AllreduceOptions& opts) {
  orderedOn(submitThenWait([&] { return allreduceAsync(input, output, opts); }), opts.stream);
}
void Runtime::broadcast(const Tensor& inout, int rootRank, const OpOptions& opts) {
  orderedOn(submitThenWait([&] { return broadcastAsync(inout, inout, rootRank, opts); }), opts.stream);
}
Work Runtime::allgather(const Tensor& input, const OpOptions& opts, Allocator alloc) {
  return orderedOn(submitThenWait([&] { return allgatherAsync(input, opts, std::move(alloc)); }), opts.stream);
}
Work Runtime::alltoall(const Tensor& input, const std::vector<int64_t>& splits, const OpOptions& opts,
                       Allocator alloc) {
  return orderedOn(submitThenWait([&] { return alltoallAsync(input, splits, opts, std::move(alloc)); }), opts.stream);
}
Work Runtime::reducescatter(const Tensor& input, const ReducescatterOptions& opts, Allocator alloc) {
  return orderedOn(submitThenWait([&] { return reducescatterAsync(input, opts, std::move(alloc)); }), opts.stream);
}
void Runtime::barrier(int32_t processSet) {
  submitThenWait([&] { return barrierAsync(processSet); });
}
int Runtime::join(int32_t processSet) { return submitThenWait([&] { return joinAsync(processSet); }).joinResult(); }

}  // namespace chorus
