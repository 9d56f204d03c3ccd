#include "zero/memory.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "chorus/error.h"
#include "chorus/runtime.h"
#include "device/device_handles.h"
#include "reduce/reduce.h"
#include "zero/cpu_adam.h"

namespace chorus::zero {

namespace {

constexpr size_t kScratchElems = 1 << 16;

class HostMemory final : public Memory {
 public:
  HostMemory() : scratch_(kScratchElems * 4) {}
  int device() const override { return kHostDevice; }
  void* stream() const override { return nullptr; }
  bool onDevice(const void*) const override { return false; }
  Buffer collective(size_t bytes) override { return Buffer::shared(bytes); }
  Buffer scratch(size_t bytes) override { return Buffer(bytes); }
  Buffer state(size_t bytes, bool, bool pin) override { return Buffer(bytes, pin); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void accumulate(DataType dtype, void* dst, const void* src, size_t n) override {
    reduceBuffers(dtype, ReduceOp::kSum, dst, dst, src, n);
  }
  void toFloat(float* dst, const void* src, DataType dtype, size_t n) override { zero::toFloat(dst, src, dtype, n); }
  void fromFloat(void* dst, const float* src, DataType dtype, size_t n) override {
    zero::fromFloat(dst, src, dtype, n);
  }
  void scale(float* p, size_t n, float factor) override {
    for (size_t k = 0; k < n; ++k) p[k] *= factor;
  }
  double sumSquares(const void* src, DataType dtype, size_t n) override { return zero::sumSquares(src, dtype, n); }
  void optimizer(OptimKind kind, const GroupHyper& h, const RunArgs& a) override {
    optimizerRun(kind, h, a, scratch_.as<float>(), kScratchElems);
  }
  void await(const Work&) override {}
  void sync() override {}

 private:
  Buffer scratch_;
};

class DeviceMemory final : public Memory {
 public:
  DeviceMemory(std::shared_ptr<DeviceBackend> b, int ordinal, void* stream)
      : b_(std::move(b)), ordinal_(ordinal), stream_(stream), norm_(b_, ordinal) {
    norm_.reserve(sizeof(double));
  }
  ~DeviceMemory() override {
    try {
      CurrentDevice on(*b_, ordinal_);
      b_->synchronizeStream(stream_);
    } catch (...) {
    }
  }
  int device() const override { return ordinal_; }
  void* stream() const override { return stream_; }
  bool onDevice(const void* p) const override { return b_->deviceOf(p) >= 0; }
  Buffer collective(size_t bytes) override { return deviceBuffer(bytes); }
  Buffer scratch(size_t bytes) override { return deviceBuffer(bytes); }
  Buffer state(size_t bytes, bool offloaded, bool pin) override {
    if (!offloaded) return deviceBuffer(bytes);
    if (!pin) return Buffer(bytes);
    auto b = b_;
    void* p = b_->allocPinned(std::max<size_t>(bytes, 1));
    std::memset(p, 0, bytes);
    return Buffer::adopt(std::shared_ptr<void>(p, [b](void* q) {
                           try {
                             b->freePinned(q);
                           } catch (...) {
                           }
                         }),
                         bytes, true);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    CurrentDevice on(*b_, ordinal_);
    b_->copy(dst, src, bytes, stream_);
    // Host memory on either side: the host reads the destination next, or may
    // free or reuse the source once this returns.
    if (b_->deviceOf(dst) < 0 || b_->deviceOf(src) < 0) b_->synchronizeStream(stream_);
  }
  void zero(void* p, size_t bytes) override {
    CurrentDevice on(*b_, ordinal_);
    b_->zero(p, bytes, stream_);
  }
  void accumulate(DataType dtype, void* dst, const void* src, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    b_->reduce(dtype, ReduceOp::kSum, dst, src, n, stream_);
  }
  void toFloat(float* dst, const void* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    if (dtype == DataType::kFloat32) b_->copy(dst, src, n * 4, stream_);
    else b_->cast(DataType::kFloat32, dst, dtype, src, n, stream_);
  }
  void fromFloat(void* dst, const float* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    if (dtype == DataType::kFloat32) b_->copy(dst, src, n * 4, stream_);
    else b_->cast(dtype, dst, DataType::kFloat32, src, n, stream_);
  }
  void scale(float* p, size_t n, float factor) override {
    CurrentDevice on(*b_, ordinal_);
    b_->scale(DataType::kFloat32, p, p, n, factor, stream_);
  }
  double sumSquares(const void* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    const double zero = 0.0;
    b_->copy(norm_.get(), &zero, sizeof zero, stream_);
    b_->sumSquares(dtype, src, n, static_cast<double*>(norm_.get()), stream_);
    double out = 0.0;
    b_->copy(&out, norm_.get(), sizeof out, stream_);
    b_->synchronizeStream(stream_);
    return out;
  }
  void optimizer(OptimKind kind, const GroupHyper& h, const RunArgs& a) override {
    CurrentDevice on(*b_, ordinal_);
    if (b_->deviceOf(a.master) < 0) return offloaded(kind, h, a);
    // The 16-bit copy goes straight into the parameters; an fp32 model's master
    // is its parameters (a.low null) or they are copied after.
    const bool lowIs16 = a.low && a.dtype != DataType::kFloat32;
    OptimTensor t{a.master, a.state1, a.state2, a.grad, lowIs16 ? a.low : nullptr, a.n};
    const DataType lowDtype = a.dtype == DataType::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
    if (kind == OptimKind::kSgd) {
      b_->sgd(sgdCoefficients(h, a.gradScale, a.step), a.dtype, lowDtype, &t, 1, stream_);
    } else {
      AdamHyper ah{h.lr, h.beta1, h.beta2, h.eps, h.weightDecay, kind == OptimKind::kAdamW, a.step, a.gradScale};
      b_->adam(adamCoefficients(ah), a.dtype, lowDtype, &t, 1, stream_);
    }
    if (a.low && a.dtype == DataType::kFloat32 && static_cast<float*>(a.low) != a.master)
      b_->copy(a.low, a.master, a.n * 4, stream_);
  }
  // offload_optimizer: master and state in (pinned) host memory. The gradients
  // come down a chunk at a time, the CPU step runs on it, and the updated
  // parameters go up in the model dtype.
  void offloaded(OptimKind kind, const GroupHyper& h, const RunArgs& a) {
    const size_t es = dtypeSize(a.dtype);
    if (stage_.size() < 2 * kChunk * es) {
      b_->synchronizeStream(stream_);
      stage_ = Buffer::adopt(std::shared_ptr<void>(b_->allocPinned(2 * kChunk * es), [b = b_](void* q) {
                               try {
                                 b->freePinned(q);
                               } catch (...) {
                               }
                             }),
                             2 * kChunk * es, true);
      scratch_ = Buffer(kScratchElems * 4);
    }
    char* grad = stage_.bytes();
    char* low = stage_.bytes() + kChunk * es;
    for (size_t off = 0; off < a.n; off += kChunk) {
      const size_t m = std::min(kChunk, a.n - off);
      b_->copy(grad, static_cast<const char*>(a.grad) + off * es, m * es, stream_);
      b_->synchronizeStream(stream_);  // (also: the last chunk's copy up has left `low`)
      RunArgs c = a;
      c.master = a.master + off;
      c.state1 = a.state1 + off;
      c.state2 = a.state2 ? a.state2 + off : nullptr;
      c.grad = grad;
      c.low = a.low ? low : nullptr;
      c.n = m;
      optimizerRun(kind, h, c, scratch_.as<float>(), kScratchElems);
      if (a.low) b_->copy(static_cast<char*>(a.low) + off * es, low, m * es, stream_);
    }
    b_->synchronizeStream(stream_);
  }

  void await(const Work& w) override {
    CurrentDevice on(*b_, ordinal_);
    w.streamWait(stream_);
  }
  void sync() override {
    CurrentDevice on(*b_, ordinal_);
    b_->synchronizeStream(stream_);
  }

 private:
  Buffer deviceBuffer(size_t bytes) {
    auto b = b_;
    void* p = b_->allocDevice(ordinal_, std::max<size_t>(bytes, 1));
    Buffer out = Buffer::adopt(std::shared_ptr<void>(p, [b](void* q) {
                                 try {
                                   b->freeDevice(q);
                                 } catch (...) {
                                 }
                               }),
                               bytes, false);
    zero(p, bytes);  // (zeroed, as host buffers are)
    return out;
  }

  static constexpr size_t kChunk = size_t{4} << 20;  // elements per offloaded chunk
  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;
  void* stream_;
  DeviceBuffer norm_;
  Buffer stage_, scratch_;  // offload: pinned chunks of gradients and parameters; CPU scratch
};

}  // namespace

std::unique_ptr<Memory> hostMemory() { return std::make_unique<HostMemory>(); }

std::unique_ptr<Memory> deviceMemory(std::shared_ptr<DeviceBackend> backend, int ordinal, void* stream) {
  if (!backend) throw InvalidArgument("ZeRO engine: a device engine needs a device backend");
  return std::make_unique<DeviceMemory>(std::move(backend), ordinal, stream);
}

}  // namespace chorus::zero
