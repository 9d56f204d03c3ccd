#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <numeric>

#include "chorus/torch.h"

namespace chorus::torch_api {

namespace {

// CPU and CUDA tensors go to the core by pointer; CUDA ones with their device.
Tensor viewOf(const torch::Tensor& t) {
  Shape shape(t.sizes().begin(), t.sizes().end());
  return Tensor{t.data_ptr(), toChorus(t.scalar_type()), shape,
                t.is_cuda() ? static_cast<int32_t>(t.get_device()) : kHostDevice};
}

// A contiguous CPU or CUDA tensor with t's data (t itself when it already is one).
torch::Tensor staged(const torch::Tensor& t) {
  torch::Tensor s = t.detach();
  if (!s.device().is_cpu() && !s.is_cuda()) s = s.cpu();
  return s.contiguous();
}

// The current stream of a CUDA tensor's device, as a cudaStream_t (torch 2.1+
// gives its native handle; before that, null: the default stream).
void* currentStream(const torch::Tensor& t) {
  if (!t.is_cuda()) return nullptr;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
#else
  return nullptr;
#endif
}

template <typename O>
O onStreamOf(const torch::Tensor& t, O opts) {
  opts.stream = currentStream(t);
  return opts;
}

// Outputs whose size is known only after negotiation are chorus's own (large
// ones from its shared pool, which peers on this host write into directly; on
// CUDA, its device memory), seen by torch as a tensor that keeps the op's
// storage alive.
torch::Tensor adopt(const Work& w, const torch::Tensor& like) {
  const Tensor& o = w.output();
  return torch::from_blob(o.data, o.shape, [w](void*) {}, like.options());
}

torch::Tensor onDevice(const torch::Tensor& staged, const torch::Tensor& like) {
  return staged.device() == like.device() ? staged : staged.to(like.device());
}

}  // namespace

DataType toChorus(c10::ScalarType t) {
  switch (t) {
    case torch::kUInt8: return DataType::kUInt8;
    case torch::kInt8: return DataType::kInt8;
    case torch::kInt16: return DataType::kInt16;
    case torch::kInt32: return DataType::kInt32;
    case torch::kInt64: return DataType::kInt64;
    case torch::kFloat16: return DataType::kFloat16;
    case torch::kBFloat16: return DataType::kBFloat16;
    case torch::kFloat32: return DataType::kFloat32;
    case torch::kFloat64: return DataType::kFloat64;
    case torch::kBool: return DataType::kBool;
    default:
      throw InvalidArgument(std::string("dtype ") + c10::toString(t) + " is not supported by chorus");
  }
}

namespace {
// A new tensor like `like`; large ones in memory that the other local ranks
// write into directly (chorus::allocateShared), as Python's hvd.allreduce.
torch::Tensor newOutput(const torch::Tensor& like) {
  const size_t bytes = static_cast<size_t>(like.numel()) * like.element_size();
  if (bytes < kSharedMinBytes || like.is_cuda()) return torch::empty_like(like);
  std::shared_ptr<void> buf = allocateShared(bytes);
  void* p = buf.get();
  return torch::from_blob(p, like.sizes(), [buf](void*) {}, like.options());
}
}  // namespace

torch::Tensor allreduce(const torch::Tensor& t, const AllreduceOptions& opts) {
  torch::Tensor in = staged(t);
  torch::Tensor out = newOutput(in);
  defaultRuntime().allreduce(viewOf(in), viewOf(out), onStreamOf(in, opts));
  return onDevice(out, t);
}

void allreduce_(torch::Tensor& t, const AllreduceOptions& opts) {
  torch::Tensor s = staged(t);
  defaultRuntime().allreduce(viewOf(s), viewOf(s), onStreamOf(s, opts));
  if (!s.is_same(t)) t.copy_(s);
}

std::vector<torch::Tensor> groupedAllreduce(const std::vector<torch::Tensor>& ts, const AllreduceOptions& opts) {
  std::vector<torch::Tensor> ins, outs;
  std::vector<Tensor> vin, vout;
  for (const auto& t : ts) {
    ins.push_back(staged(t));
    outs.push_back(torch::empty_like(ins.back()));
    vin.push_back(viewOf(ins.back()));
    vout.push_back(viewOf(outs.back()));
  }
  if (!ins.empty()) {
    const AllreduceOptions o = onStreamOf(ins[0], opts);
    Work w = defaultRuntime().groupedAllreduceAsync(vin, vout, o);
    w.wait();
    w.streamWait(o.stream);
  }
  for (size_t i = 0; i < ts.size(); ++i) outs[i] = onDevice(outs[i], ts[i]);
  return outs;
}

torch::Tensor allgather(const torch::Tensor& t, const OpOptions& opts) {
  torch::Tensor in = staged(t);
  return onDevice(adopt(defaultRuntime().allgather(viewOf(in), onStreamOf(in, opts)), in), t);
}

torch::Tensor broadcast(const torch::Tensor& t, int rootRank, const OpOptions& opts) {
  torch::Tensor in = staged(t);
  torch::Tensor out = torch::empty_like(in);
  const OpOptions o = onStreamOf(in, opts);
  Work w = defaultRuntime().broadcastAsync(viewOf(in), viewOf(out), rootRank, o);
  w.wait();
  w.streamWait(o.stream);
  return onDevice(out, t);
}

void broadcast_(torch::Tensor& t, int rootRank, const OpOptions& opts) {
  torch::Tensor s = staged(t);
  defaultRuntime().broadcast(viewOf(s), rootRank, onStreamOf(s, opts));
  if (!s.is_same(t)) t.copy_(s);
}

std::pair<torch::Tensor, std::vector<int64_t>> alltoall(const torch::Tensor& t, const std::vector<int64_t>& splits,
                                                        const OpOptions& opts) {
  torch::Tensor in = staged(t);
  Work w = defaultRuntime().alltoall(viewOf(in), splits, onStreamOf(in, opts));
  return {onDevice(adopt(w, in), t), w.receivedSplits()};
}

torch::Tensor reducescatter(const torch::Tensor& t, const ReducescatterOptions& opts) {
  torch::Tensor in = staged(t);
  return onDevice(adopt(defaultRuntime().reducescatter(viewOf(in), onStreamOf(in, opts)), in), t);
}

void broadcastParameters(const std::vector<std::pair<std::string, torch::Tensor>>& named, int rootRank) {
  torch::NoGradGuard noGrad;
  std::vector<Work> works;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copyBack;
  for (const auto& [name, p] : named) {
    torch::Tensor s = staged(p);
    OpOptions o;
    o.name = "broadcast.parameter." + name;
    o.stream = currentStream(s);
    works.push_back(defaultRuntime().broadcastAsync(viewOf(s), viewOf(s), rootRank, o));
    copyBack.emplace_back(p, s);
  }
  for (size_t i = 0; i < works.size(); ++i) {
    works[i].wait();
    works[i].streamWait(currentStream(copyBack[i].second));
  }
  for (auto& [p, s] : copyBack)
    if (!s.is_same(p)) p.copy_(s);
}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> inner,
                                           std::vector<std::pair<std::string, torch::Tensor>> namedParameters,
                                           ReduceOp op, int32_t processSet)
    : inner_(std::move(inner)), params_(std::move(namedParameters)), op_(op), processSet_(processSet) {
  if (op != ReduceOp::kAverage && op != ReduceOp::kSum)
    throw InvalidArgument("DistributedOptimizer supports Average and Sum");
}

void DistributedOptimizer::synchronize() {
  torch::NoGradGuard noGrad;
  std::vector<Tensor> views;
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params_) {
    if (!p.grad().defined()) continue;
    torch::Tensor g = staged(p.grad());
    grads.push_back(g);
    views.push_back(viewOf(g));
  }
  AllreduceOptions o;
  o.op = op_;
  o.name = "distributed_optimizer.grads";
  o.processSet = processSet_;
  if (!views.empty()) {
    o.stream = currentStream(grads[0]);
    Work w = defaultRuntime().groupedAllreduceAsync(views, views, o);
    w.wait();
    w.streamWait(o.stream);
  }
  size_t i = 0;
  for (auto& [name, p] : params_) {
    if (!p.grad().defined()) continue;
    if (!grads[i].is_same(p.grad())) p.mutable_grad().copy_(grads[i]);
    ++i;
  }
  synchronized_ = true;
}

torch::Tensor DistributedOptimizer::step(torch::optim::Optimizer::LossClosure closure) {
  if (!synchronized_) synchronize();
  synchronized_ = false;
  return inner_->step(std::move(closure));
}

void DistributedOptimizer::zero_grad() { inner_->zero_grad(); }

}  // namespace chorus::torch_api
