// CUDA tensors staged through pinned host memory into the set's CPU collective
// (ranks that share a GPU, no NCCL, or CHORUS_GPU_OPERATIONS=host). An
// allreduce runs in chunks: chunk k+1 comes down (D2H on one side stream)
// while the CPU reduces chunk k and chunk k-1 goes back up (H2D on another),
// so a large allreduce costs about the slowest of the three, not their sum.
#include <algorithm>
#include <array>
#include <cstring>

#include "chorus/error.h"
#include "comm/device_path.h"
#include "device/device_handles.h"

namespace chorus {

namespace {

constexpr int kSlots = 3;  // down, reduce, up in flight at once

class StagedPath final : public DevicePath {
 public:
  StagedPath(std::shared_ptr<DeviceBackend> b, int ordinal, Communicator& cpu, const DevicePathOptions& opts)
      : b_(std::move(b)),
        ordinal_(ordinal),
        cpu_(cpu),
        chunkBytes_(static_cast<size_t>(std::max<int64_t>(opts.stageChunkBytes, 4096))),
        down_(b_, ordinal),
        up_(b_, ordinal),
        start_(b_, ordinal),
        whole_(b_, -1) {
    for (int i = 0; i < kSlots; ++i) {
      slots_[i].mem = std::make_unique<DeviceBuffer>(b_, -1);
      slots_[i].downDone = std::make_unique<DeviceEvent>(b_, ordinal);
      slots_[i].upDone = std::make_unique<DeviceEvent>(b_, ordinal);
    }
  }
  ~StagedPath() override {  // (never throws: after a CUDA error the copies are lost anyway)
    try {
      for (auto& s : slots_)
        if (s.upPending) b_->synchronize(s.upDone->get());
      if (wholeUp_) b_->synchronize(wholeDone_->get());
    } catch (...) {
    }
  }

  const char* transport() const override { return "STAGED"; }

  void allreduce(void* buf, const void* in, size_t count, DataType dtype, ReduceOp op, double scale,
                 void* stream) override {
    const size_t esize = dtypeSize(dtype);
    const size_t per = std::max<size_t>(1, chunkBytes_ / esize);
    const size_t chunks = (count + per - 1) / per;
    // The side streams start after what the op's stream holds (ready events, packing).
    b_->record(start_.get(), stream);
    b_->streamWait(down_.get(), start_.get());
    b_->streamWait(up_.get(), start_.get());
    auto down = [&](size_t k) {
      Slot& s = slotFor(k);
      const size_t n = std::min(per, count - k * per);
      s.mem->reserve(per * esize);
      b_->copy(s.mem->get(), static_cast<const char*>(in) + k * per * esize, n * esize, down_.get());
      b_->record(s.downDone->get(), down_.get());
    };
    if (chunks) down(0);
    for (size_t k = 0; k < chunks; ++k) {
      Slot& s = slots_[k % kSlots];
      if (k + 1 < chunks) down(k + 1);  // overlaps this chunk's reduction
      waitHost(s.downDone->get());
      const size_t n = std::min(per, count - k * per);
      reduceHost(s.mem->get(), n, dtype, op, scale);
      b_->copy(static_cast<char*>(buf) + k * per * esize, s.mem->get(), n * esize, up_.get());
      b_->record(s.upDone->get(), up_.get());
      s.upPending = true;
    }
    // The op's stream continues once everything is back up.
    b_->record(start_.get(), up_.get());
    b_->streamWait(stream, start_.get());
  }

  void allreduceJoined(size_t count, DataType dtype, ReduceOp op, double scale, void*) override {
    const size_t esize = dtypeSize(dtype);
    const size_t per = std::max<size_t>(1, chunkBytes_ / esize);
    std::vector<char> zeros;
    for (size_t at = 0; at < count; at += per) {  // the same chunks as the others
      const size_t n = std::min(per, count - at);
      zeros.assign(n * esize, 0);
      reduceHost(zeros.data(), n, dtype, op, scale);
    }
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes, void* stream) override {
    size_t total = 0, mine = bytes[cpu_.rank()];
    for (size_t b : bytes) total += b;
    char* host = static_cast<char*>(wholeBuffer(total + mine));
    char* myPiece = host + total;
    toHost(myPiece, in, mine, stream);
    cpu_.allgatherv(myPiece, host, bytes);
    toDevice(out, host, total, stream);
  }

  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    char* host = static_cast<char*>(wholeBuffer(bytes));
    if (cpu_.rank() == root) toHost(host, buf, bytes, stream);
    cpu_.broadcast(host, bytes, root);
    if (cpu_.rank() != root) toDevice(buf, host, bytes, stream);
  }

  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, void* stream) override {
    size_t sent = 0, got = 0, largest = 0;
    for (size_t b : sendBytes) sent += b;
    for (size_t b : recvBytes) got += b;
    for (int r = 0; r < cpu_.size(); ++r)
      if (r != cpu_.rank()) largest = std::max({largest, sendBytes[r], recvBytes[r]});
    // Every rank must pass the same largest piece: agree on it (one small collective).
    uint64_t word = largest;
    std::vector<uint64_t> all(cpu_.size());
    cpu_.allgatherv(&word, all.data(), std::vector<size_t>(cpu_.size(), sizeof word));
    largest = *std::max_element(all.begin(), all.end());
    char* host = static_cast<char*>(wholeBuffer(sent + got));
    toHost(host, in, sent, stream);
    cpu_.alltoallv(host, sendBytes, host + sent, recvBytes, largest);
    toDevice(out, host + sent, got, stream);
  }

  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                     double scale, void* stream) override {
    const size_t esize = dtypeSize(dtype);
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t mine = counts[cpu_.rank()];
    char* host = static_cast<char*>(wholeBuffer((total + mine) * esize));
    toHost(host, in, total * esize, stream);
    char* result = host + total * esize;
    if (scale != 1.0) cpu_.reducescatterScaled(host, result, counts, dtype, op, scale);
    else cpu_.reducescatter(host, result, counts, dtype, op);
    toDevice(out, result, mine * esize, stream);
  }

  void abort() override { cpu_.abort(); }

 private:
  struct Slot {
    std::unique_ptr<DeviceBuffer> mem;
    std::unique_ptr<DeviceEvent> downDone, upDone;
    bool upPending = false;
  };
  // Chunk k's slot, once the copy up of the chunk that used it last is done.
  Slot& slotFor(size_t k) {
    Slot& s = slots_[k % kSlots];
    if (s.upPending) {
      waitHost(s.upDone->get());
      s.upPending = false;
    }
    return s;
  }
  void reduceHost(void* data, size_t n, DataType dtype, ReduceOp op, double scale) {
    const std::vector<Span> spans{{data, n}};
    if (scale != 1.0) cpu_.allreduceSpansScaled(spans, dtype, op, scale);
    else cpu_.allreduceSpans(spans, dtype, op);
  }
  void waitHost(void* event) { b_->synchronize(event); }
  // Pinned memory for a whole (unchunked) op, once the last one's copy up is done.
  void* wholeBuffer(size_t bytes) {
    if (wholeUp_) {
      waitHost(wholeDone_->get());
      wholeUp_ = false;
    }
    return whole_.reserve(std::max<size_t>(bytes, 1));
  }
  void toHost(void* host, const void* dev, size_t bytes, void* stream) {
    b_->copy(host, dev, bytes, stream);
    b_->record(start_.get(), stream);
    waitHost(start_.get());
  }
  void toDevice(void* dev, const void* host, size_t bytes, void* stream) {
    b_->copy(dev, host, bytes, stream);
    if (!wholeDone_) wholeDone_ = std::make_unique<DeviceEvent>(b_, ordinal_);
    b_->record(wholeDone_->get(), stream);
    wholeUp_ = true;
  }

  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;
  Communicator& cpu_;
  size_t chunkBytes_;
  DeviceStream down_, up_;
  DeviceEvent start_;
  std::array<Slot, kSlots> slots_;
  DeviceBuffer whole_;
  std::unique_ptr<DeviceEvent> wholeDone_;
  bool wholeUp_ = false;
};

}  // namespace

std::unique_ptr<DevicePath> makeStagedPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                           Communicator& cpu, const DevicePathOptions& opts) {
  return std::make_unique<StagedPath>(backend, ordinal, cpu, opts);
}

}  // namespace chorus
