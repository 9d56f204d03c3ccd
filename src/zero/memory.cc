#include "zero/memory.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "chorus/error.h"
#include "chorus/runtime.h"
#include "device/device_handles.h"
#include "reduce/reduce.h"
#include "reduce/cast.h"
#include "reduce/cpu_optimizer.h"

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
  void toFloat(float* dst, const void* src, DataType dtype, size_t n) override { chorus::toFloat(dst, src, dtype, n); }
  void fromFloat(void* dst, const float* src, DataType dtype, size_t n) override {
    chorus::fromFloat(dst, src, dtype, n);
  }
  void scale(float* p, size_t n, float factor) override {
    for (size_t k = 0; k < n; ++k) p[k] *= factor;
  }
  double sumSquares(const void* src, DataType dtype, size_t n) override { return chorus::sumSquares(src, dtype, n); }
  void optimizer(OptimKind kind, const GroupHyper& h, const RunArgs& a) override {
    optimizerRun(kind, h, a, scratch_.as<float>(), kScratchElems);
  }
  void lambMoments(const GroupHyper& h, const RunArgs& a, double* wsq, double* usq) override {
    lambMomentsRun(h, a, scratch_.as<float>(), kScratchElems, wsq, usq);
  }
  void lambApply(const GroupHyper& h, const RunArgs& a, float trust) override { lambApplyRun(h, a, trust); }
  void await(const Work&) override {}
  void retire(std::shared_ptr<void>) override {}
  void normBegin() override { norm_ = 0.0; }
  void normAdd(const void* src, DataType dtype, size_t n) override { norm_ += chorus::sumSquares(src, dtype, n); }
  double normEnd() override { return norm_; }
  void sync() override {}

 private:
  Buffer scratch_;
  double norm_ = 0.0;
};

class DeviceMemory final : public Memory {
 public:
  DeviceMemory(std::shared_ptr<DeviceBackend> b, int ordinal, void* stream, size_t chunkElems)
      : chunk_(std::max<size_t>(chunkElems, 1)), b_(std::move(b)), ordinal_(ordinal), stream_(stream), norm_(b_, ordinal) {
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
    Buffer out = pinnedBuffer(bytes);
    std::memset(out.bytes(), 0, bytes);
    return out;
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
    if (!host(p)) return b_->zero(p, bytes, stream_);
    b_->synchronizeStream(stream_);
    if (bytes) std::memset(p, 0, bytes);
  }
  void accumulate(DataType dtype, void* dst, const void* src, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    b_->reduce(dtype, ReduceOp::kSum, dst, src, n, stream_);
  }
  // A side in host memory (offloaded state) is converted on the CPU: a kernel
  // cannot reach pageable memory.
  void toFloat(float* dst, const void* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    if (!host(dst) && !host(src)) {
      if (dtype == DataType::kFloat32) b_->copy(dst, src, n * 4, stream_);
      else b_->cast(DataType::kFloat32, dst, dtype, src, n, stream_);
      return;
    }
    std::vector<char> down;
    const void* from = onHost(src, n * dtypeSize(dtype), down);
    convertInto(dst, n * 4, [&](void* out) { chorus::toFloat(static_cast<float*>(out), from, dtype, n); });
  }
  void fromFloat(void* dst, const float* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    if (!host(dst) && !host(src)) {
      if (dtype == DataType::kFloat32) b_->copy(dst, src, n * 4, stream_);
      else b_->cast(dtype, dst, DataType::kFloat32, src, n, stream_);
      return;
    }
    std::vector<char> down;
    const float* from = static_cast<const float*>(onHost(src, n * 4, down));
    convertInto(dst, n * dtypeSize(dtype), [&](void* out) { chorus::fromFloat(out, from, dtype, n); });
  }
  void scale(float* p, size_t n, float factor) override {
    CurrentDevice on(*b_, ordinal_);
    if (!host(p)) return b_->scale(DataType::kFloat32, p, p, n, factor, stream_);
    b_->synchronizeStream(stream_);
    for (size_t k = 0; k < n; ++k) p[k] *= factor;
  }
  double sumSquares(const void* src, DataType dtype, size_t n) override {
    normBegin();
    normAdd(src, dtype, n);
    return normEnd();
  }
  void normBegin() override {
    CurrentDevice on(*b_, ordinal_);
    b_->zero(norm_.get(), sizeof(double), stream_);
  }
  void normAdd(const void* src, DataType dtype, size_t n) override {
    CurrentDevice on(*b_, ordinal_);
    b_->sumSquares(dtype, src, n, static_cast<double*>(norm_.get()), stream_);
  }
  double normEnd() override {
    CurrentDevice on(*b_, ordinal_);
    double out = 0.0;
    b_->copy(&out, norm_.get(), sizeof out, stream_);
    b_->synchronizeStream(stream_);
    retired_.clear();  // (everything queued is done)
    return out;
  }
  void retire(std::shared_ptr<void> held) override {
    CurrentDevice on(*b_, ordinal_);
    // What an earlier retirement's event says is done goes first.
    while (!retired_.empty() && b_->query(retired_.front().first->get())) retired_.pop_front();
    auto e = std::make_shared<DeviceEvent>(b_, ordinal_);
    b_->record(e->get(), stream_);
    retired_.emplace_back(std::move(e), std::move(held));
  }
  void lambMoments(const GroupHyper&, const RunArgs&, double*, double*) override { deviceOnly("LAMB"); }
  void lambApply(const GroupHyper&, const RunArgs&, float) override { deviceOnly("LAMB"); }
  [[noreturn]] static void deviceOnly(const char* what) {
    throw InvalidArgument(std::string("ZeRO engine on a device: ") + what +
                          " steps through the engine's external path (chorus.deepspeed steps it in torch)");
  }
  void optimizer(OptimKind kind, const GroupHyper& h, const RunArgs& a) override {
    CurrentDevice on(*b_, ordinal_);
    if (b_->deviceOf(a.master) < 0) return offloaded(kind, h, a);
    if (kind == OptimKind::kLion || kind == OptimKind::kAdagrad || kind == OptimKind::kLamb)
      deviceOnly(kind == OptimKind::kLion ? "Lion" : kind == OptimKind::kAdagrad ? "Adagrad" : "LAMB");
    // The 16-bit copy goes straight into the parameters; an fp32 model's master
    // is its parameters (a.low null) or they are copied after.
    // (16-bit parameters in host memory, offload_param: written from the master after)
    const bool lowIs16 = a.low && a.dtype != DataType::kFloat32 && !host(a.low);
    OptimTensor t{a.master, a.state1, a.state2, a.grad, lowIs16 ? a.low : nullptr, a.n};
    const DataType lowDtype = a.dtype == DataType::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
    if (kind == OptimKind::kSgd) {
      b_->sgd(sgdCoefficients(h, a.gradScale, a.step), a.dtype, lowDtype, &t, 1, stream_);
    } else {
      AdamHyper ah{h.lr, h.beta1, h.beta2, h.eps, h.weightDecay, kind == OptimKind::kAdamW, a.step, a.gradScale,
                   h.biasCorrection};
      b_->adam(adamCoefficients(ah), a.dtype, lowDtype, &t, 1, stream_);
    }
    if (a.low && !lowIs16 && static_cast<void*>(a.low) != static_cast<void*>(a.master))
      fromFloat(a.low, a.master, a.dtype, a.n);
  }
  // offload_optimizer: master and state in (pinned) host memory. Gradients
  // come down a chunk at a time; the CPU step on chunk k overlaps the copy of
  // chunk k+1 down and of chunk k-1's parameters up (two buffers of each).
  void offloaded(OptimKind kind, const GroupHyper& h, const RunArgs& a) {
    const size_t es = dtypeSize(a.dtype);
    if (stage_.size() < 4 * chunk_ * es) {
      b_->synchronizeStream(stream_);
      stage_ = pinnedBuffer(4 * chunk_ * es);
      scratch_ = Buffer(kScratchElems * 4);
      for (auto& e : downEv_) e = std::make_unique<DeviceEvent>(b_, ordinal_);
    }
    auto grad = [&](size_t k) { return stage_.bytes() + (k % 2) * chunk_ * es; };
    auto low = [&](size_t k) { return stage_.bytes() + (2 + k % 2) * chunk_ * es; };
    auto length = [&](size_t k) { return std::min(chunk_, a.n - k * chunk_); };
    auto down = [&](size_t k) {
      b_->copy(grad(k), static_cast<const char*>(a.grad) + k * chunk_ * es, length(k) * es, stream_);
      b_->record(downEv_[k % 2]->get(), stream_);
    };
    const size_t chunks = (a.n + chunk_ - 1) / chunk_;
    if (chunks) down(0);
    for (size_t k = 0; k < chunks; ++k) {
      if (k + 1 < chunks) down(k + 1);  // (its buffer's last reader, step k - 1, is done)
      // Chunk k is down, and (one stream, in order) chunk k - 2's parameters have left low(k).
      b_->synchronize(downEv_[k % 2]->get());
      const size_t off = k * chunk_, m = length(k);
      RunArgs c = a;
      c.master = a.master + off;
      c.state1 = a.state1 + off;
      c.state2 = a.state2 ? a.state2 + off : nullptr;
      c.grad = grad(k);
      c.low = a.low ? low(k) : nullptr;
      c.n = m;
      optimizerRun(kind, h, c, scratch_.as<float>(), kScratchElems);
      if (a.low) {
        b_->copy(static_cast<char*>(a.low) + off * es, low(k), m * es, stream_);
      }
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
    retired_.clear();
  }

 private:
  Buffer pinnedBuffer(size_t bytes) {
    CurrentDevice on(*b_, ordinal_);
    void* p = b_->allocPinned(std::max<size_t>(bytes, 1));
    return Buffer::adopt(std::shared_ptr<void>(p, [b = b_](void* q) {
                           try {
                             b->freePinned(q);
                           } catch (...) {
                           }
                         }),
                         bytes, true);
  }
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

  bool host(const void* p) const { return b_->deviceOf(p) < 0; }
  // src readable by the host: itself (after the stream's work), or a copy in `down`.
  const void* onHost(const void* src, size_t bytes, std::vector<char>& down) {
    if (!host(src)) {
      down.resize(bytes);
      b_->copy(down.data(), src, bytes, stream_);
    }
    b_->synchronizeStream(stream_);
    return host(src) ? src : down.data();
  }
  // write(out) fills `bytes` of host memory that end up in dst.
  template <typename Write>
  void convertInto(void* dst, size_t bytes, Write write) {
    if (host(dst)) return write(dst);
    std::vector<char> up(bytes);
    write(up.data());
    b_->copy(dst, up.data(), bytes, stream_);
    b_->synchronizeStream(stream_);
  }

  const size_t chunk_;  // elements per offloaded chunk
  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;
  void* stream_;
  DeviceBuffer norm_;
  Buffer stage_, scratch_;  // offload: pinned chunks of gradients and parameters; CPU scratch
  std::unique_ptr<DeviceEvent> downEv_[2];
  std::deque<std::pair<std::shared_ptr<DeviceEvent>, std::shared_ptr<void>>> retired_;
};

}  // namespace

std::unique_ptr<Memory> hostMemory() { return std::make_unique<HostMemory>(); }

std::unique_ptr<Memory> deviceMemory(std::shared_ptr<DeviceBackend> backend, int ordinal, void* stream,
                                     size_t offloadChunkElems) {
  if (!backend) throw InvalidArgument("ZeRO engine: a device engine needs a device backend");
  return std::make_unique<DeviceMemory>(std::move(backend), ordinal, stream, offloadChunkElems);
}

}  // namespace chorus::zero
