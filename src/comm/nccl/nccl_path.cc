// CUDA tensors over NCCL, one communicator per process set (every rank has a
// GPU of its own). Ops are queued on the caller's stream and return at once; a
// watchdog thread polls the queued work, and on NCCL's asynchronous error or a
// timeout aborts the communicator (ncclCommAbort), so that kernels stuck on a
// dead peer end and the next op on the set fails with PeerFailure or Timeout.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "chorus/error.h"
#include "comm/device_path.h"
#include "comm/nccl/nccl_api.h"
#include "core/logging.h"
#include "device/device_handles.h"

namespace chorus {

namespace {

using Clock = std::chrono::steady_clock;

int ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return kNcclSum;
    case ReduceOp::kMin: return kNcclMin;
    case ReduceOp::kMax: return kNcclMax;
    case ReduceOp::kProduct: return kNcclProd;
    default: throw InvalidArgument(std::string("NCCL has no ") + reduceOpName(op) + " reduction");
  }
}

int ncclType(DataType t, const char* what) {
  const int n = ncclDataType(t);
  if (n < 0) throw InvalidArgument(std::string(what) + " over NCCL: NCCL has no " + dtypeName(t) + " type");
  return n;
}

constexpr int kBytes = 1;  // ncclUint8

class NcclPath final : public DevicePath {
 public:
  NcclPath(std::shared_ptr<DeviceBackend> b, int ordinal, Communicator& cpu, const DevicePathOptions& opts)
      : b_(std::move(b)), api_(ncclApi()), ordinal_(ordinal), cpu_(cpu), timeout_(opts.timeoutSeconds),
        zeros_(b_, ordinal) {
    NcclUniqueId id{};
    if (cpu.rank() == 0) api_.check(api_.getUniqueId(&id), "ncclGetUniqueId");
    cpu.broadcast(&id, sizeof id, 0);  // the set's own CPU path carries the id
    const int prev = b_->current();
    b_->setCurrent(ordinal);
    const int rc = api_.commInitRank(&comm_, cpu.size(), id, cpu.rank());
    b_->setCurrent(prev);
    api_.check(rc, "ncclCommInitRank");
    watchdog_ = std::thread([this] { watch(); });
  }
  // Waits for queued work up to the timeout; what does not finish (a dead peer)
  // is aborted rather than waited for.
  ~NcclPath() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (aborted_) return;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    while (!queued_.empty() && Clock::now() < deadline) {
      if (b_->query(queued_.front().event->get())) queued_.pop_front();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (queued_.empty()) api_.commDestroy(comm_);
    else api_.commAbort(comm_);
  }

  const char* transport() const override { return "NCCL"; }

  void allreduce(void* buf, const void* in, size_t count, DataType dtype, ReduceOp op, double scale,
                 void* stream) override {
    healthy();
    api_.check(api_.allReduce(in, buf, count, ncclType(dtype, "allreduce"), ncclOp(op), comm_, stream),
               "ncclAllReduce", comm_);
    if (scale != 1.0) b_->scale(dtype, buf, buf, count, scale, stream);
    watchOver(stream);
  }
  void allreduceJoined(size_t count, DataType dtype, ReduceOp op, double scale, void* stream) override {
    void* z = zeros_.zeroed(count * dtypeSize(dtype), stream);  // (afresh: the last use summed into it)
    allreduce(z, z, count, dtype, op, 1.0, stream);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes, void* stream) override {
    healthy();
    bool even = true;
    for (size_t x : bytes) even &= x == bytes[0];
    if (even) {
      api_.check(api_.allGather(in, out, bytes[0], kBytes, comm_, stream), "ncclAllGather", comm_);
    } else {  // (uneven pieces: one broadcast per rank in one group, as Horovod does)
      api_.check(api_.groupStart(), "ncclGroupStart");
      size_t at = 0;
      for (int r = 0; r < cpu_.size(); at += bytes[r], ++r)
        if (bytes[r])
          api_.check(api_.broadcast(in, static_cast<char*>(out) + at, bytes[r], kBytes, r, comm_, stream),
                     "ncclBroadcast", comm_);
      api_.check(api_.groupEnd(), "ncclGroupEnd", comm_);
    }
    watchOver(stream);
  }
  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    healthy();
    api_.check(api_.broadcast(buf, buf, bytes, kBytes, root, comm_, stream), "ncclBroadcast", comm_);
    watchOver(stream);
  }
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, void* stream) override {
    healthy();
    api_.check(api_.groupStart(), "ncclGroupStart");
    size_t s = 0, r = 0;
    for (int p = 0; p < cpu_.size(); s += sendBytes[p], r += recvBytes[p], ++p) {
      if (sendBytes[p])
        api_.check(api_.send(static_cast<const char*>(in) + s, sendBytes[p], kBytes, p, comm_, stream), "ncclSend",
                   comm_);
      if (recvBytes[p])
        api_.check(api_.recv(static_cast<char*>(out) + r, recvBytes[p], kBytes, p, comm_, stream), "ncclRecv",
                   comm_);
    }
    api_.check(api_.groupEnd(), "ncclGroupEnd", comm_);
    watchOver(stream);
  }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                     double scale, void* stream) override {
    healthy();
    const int t = ncclType(dtype, "reducescatter");
    bool even = true;
    for (size_t c : counts) even &= c == counts[0];
    if (even) {
      api_.check(api_.reduceScatter(in, out, counts[0], t, ncclOp(op), comm_, stream), "ncclReduceScatter", comm_);
    } else {  // (uneven blocks: one reduce per rank in one group)
      api_.check(api_.groupStart(), "ncclGroupStart");
      size_t at = 0;
      const size_t esize = dtypeSize(dtype);
      for (int r = 0; r < cpu_.size(); at += counts[r], ++r)
        if (counts[r])
          api_.check(api_.reduce(static_cast<const char*>(in) + at * esize, out, counts[r], t, ncclOp(op), r, comm_,
                                 stream),
                     "ncclReduce", comm_);
      api_.check(api_.groupEnd(), "ncclGroupEnd", comm_);
    }
    if (scale != 1.0) b_->scale(dtype, out, out, counts[cpu_.rank()], scale, stream);
    watchOver(stream);
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    abortLocked(std::make_exception_ptr(PeerFailure("the process set was aborted")));
  }

 private:
  struct Watched {
    std::unique_ptr<DeviceEvent> event;
    Clock::time_point since;
  };
  // The error that ended this communicator, rethrown by every later op.
  void healthy() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) std::rethrow_exception(failed_);
  }
  void watchOver(void* stream) {
    auto e = std::make_unique<DeviceEvent>(b_, ordinal_);
    b_->record(e->get(), stream);
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back({std::move(e), Clock::now()});
    cv_.notify_all();
  }
  void abortLocked(std::exception_ptr why) {
    if (!failed_) failed_ = why;
    if (!aborted_) {
      aborted_ = true;
      api_.commAbort(comm_);
    }
  }
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(queued_.empty() ? 200 : 2));
      while (!queued_.empty() && b_->query(queued_.front().event->get())) queued_.pop_front();
      if (aborted_) {
        queued_.clear();
        continue;
      }
      int async = 0;
      if (api_.commGetAsyncError(comm_, &async) == kNcclSuccess && async != kNcclSuccess &&
          async != kNcclInProgress) {
        CHORUS_LOG(LogLevel::kError, -1, "NCCL reported an error on a process set's communicator ("
                                              << api_.getErrorString(async) << "); aborting it");
        abortLocked(std::make_exception_ptr(
            PeerFailure(std::string("NCCL error: ") + api_.getErrorString(async) + " (communicator aborted)")));
      } else if (!queued_.empty() &&
                 std::chrono::duration<double>(Clock::now() - queued_.front().since).count() > timeout_) {
        CHORUS_LOG(LogLevel::kError, -1, "an NCCL op did not finish within the timeout; aborting the communicator");
        abortLocked(std::make_exception_ptr(
            Timeout("an NCCL op did not finish within " + std::to_string(timeout_) +
                    " s (a peer died or stopped); the communicator was aborted")));
      }
    }
  }

  std::shared_ptr<DeviceBackend> b_;
  const NcclApi& api_;
  int ordinal_;
  Communicator& cpu_;
  double timeout_;
  NcclComm comm_ = nullptr;
  DeviceBuffer zeros_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Watched> queued_;
  std::exception_ptr failed_;
  bool aborted_ = false, stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<DevicePath> makeNcclPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                         Communicator& cpu, const DevicePathOptions& opts) {
  return std::make_unique<NcclPath>(backend, ordinal, cpu, opts);
}

}  // namespace chorus
