// CUDA tensors over NCCL, one communicator per process set (every rank has a
// GPU of its own). Ops are queued on the caller's stream and return at once; a
// watchdog thread polls the queued work, and on NCCL's asynchronous error, a
// CUDA error or a timeout aborts the communicator (ncclCommAbort), so that
// kernels stuck on a dead peer end and the next op on the set fails with
// PeerFailure or Timeout. An op's clock starts when it starts on the GPU, not
// when it is queued behind the caller's kernels. The communicator is not
// aborted while a thread is inside an NCCL call on it: the abort waits for
// that call to return (NCCL's communicators are not thread-safe), unless the
// call has not returned within min(timeout, 10 s): one blocked on a dead peer
// returns only when aborted.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "chorus/error.h"
#include "comm/device_path.h"
#include "comm/nccl/nccl_api.h"
#include "base/logging.h"
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
  NcclPath(std::shared_ptr<DeviceBackend> b, int ordinal, Communicator& cpu, const DevicePathOptions& opts,
           const NcclApi& api)
      : b_(std::move(b)), api_(api), ordinal_(ordinal), cpu_(cpu), timeout_(opts.timeoutSeconds),
        zeros_(b_, ordinal) {
    NcclUniqueId id{};
    if (cpu.rank() == 0) api_.check(api_.getUniqueId(&id), "ncclGetUniqueId");
    cpu.broadcast(&id, sizeof id, 0);  // the set's own CPU path carries the id
    {
      CurrentDevice on(*b_, ordinal);
      api_.check(api_.commInitRank(&comm_, cpu.size(), id, cpu.rank()), "ncclCommInitRank");
    }
    watchdog_ = std::thread([this] { watch(); });
  }
  // Waits for queued work up to the timeout; what does not finish (a dead peer,
  // a broken device) is aborted rather than waited for. Never throws.
  ~NcclPath() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (aborted_) return;
    bool drained = false;
    try {
      CurrentDevice on(*b_, ordinal_);
      const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
      while (!queued_.empty() && Clock::now() < deadline) {
        if (b_->query(queued_.front().done->get())) queued_.pop_front();
        else std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      drained = queued_.empty();
    } catch (...) {  // (a CUDA error: the device's work is lost)
    }
    if (drained) api_.commDestroy(comm_);
    else api_.commAbort(comm_);
  }

  const char* transport() const override { return "NCCL"; }

  void allreduce(void* buf, const void* in, size_t count, DataType dtype, ReduceOp op, double scale,
                 void* stream) override {
    InCall call(*this, stream);
    api_.check(api_.allReduce(in, buf, count, ncclType(dtype, "allreduce"), ncclOp(op), comm_, stream),
               "ncclAllReduce", comm_);
    if (scale != 1.0) b_->scale(dtype, buf, buf, count, scale, stream);
  }
  void allreduceJoined(size_t count, DataType dtype, ReduceOp op, double scale, void* stream) override {
    CurrentDevice on(*b_, ordinal_);
    void* z = zeros_.zeroed(count * dtypeSize(dtype), stream);  // (afresh: the last use summed into it)
    allreduce(z, z, count, dtype, op, 1.0, stream);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes, void* stream) override {
    InCall call(*this, stream);
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
  }
  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    InCall call(*this, stream);
    api_.check(api_.broadcast(buf, buf, bytes, kBytes, root, comm_, stream), "ncclBroadcast", comm_);
  }
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, void* stream) override {
    InCall call(*this, stream);
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
  }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                     double scale, void* stream) override {
    InCall call(*this, stream);
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
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    abortLocked(std::make_exception_ptr(PeerFailure("the process set was aborted")));
  }

 private:
  struct Watched {
    std::unique_ptr<DeviceEvent> start, done;  // recorded before and after the op on its stream
    bool started = false;
    Clock::time_point since;  // when start was seen complete
  };
  // One op's NCCL calls: refused once the communicator failed; an abort asked
  // for meanwhile waits for the last call to return. On leaving, the op is
  // watched from its start on the GPU to its end.
  class InCall {
   public:
    InCall(NcclPath& p, void* stream) : p_(p), stream_(stream), on_(*p.b_, p.ordinal_) {
      w_.start = std::make_unique<DeviceEvent>(p_.b_, p_.ordinal_);  // (before counting: they may throw)
      w_.done = std::make_unique<DeviceEvent>(p_.b_, p_.ordinal_);
      {
        std::lock_guard<std::mutex> lock(p_.mu_);
        if (p_.failed_) std::rethrow_exception(p_.failed_);
        if (p_.inCall_++ == 0) p_.inCallSince_ = Clock::now();
      }
      try {
        p_.b_->record(w_.start->get(), stream_);
      } catch (...) {
        leave();
        throw;
      }
    }
    ~InCall() {
      bool ok = true;
      try {
        p_.b_->record(w_.done->get(), stream_);
      } catch (...) {
        ok = false;
      }
      leave(ok ? &w_ : nullptr);
    }

   private:
    void leave(Watched* w = nullptr) {
      std::lock_guard<std::mutex> lock(p_.mu_);
      if (w) p_.queued_.push_back(std::move(*w));
      if (--p_.inCall_ == 0 && p_.abortPending_) p_.doAbortLocked();
      p_.cv_.notify_all();
    }
    NcclPath& p_;
    void* stream_;
    CurrentDevice on_;
    Watched w_;
  };
  void abortLocked(std::exception_ptr why) {
    if (!failed_) failed_ = why;
    if (aborted_) return;
    if (inCall_ > 0) abortPending_ = true;  // (the call in progress aborts as it leaves)
    else doAbortLocked();
  }
  void doAbortLocked() {
    abortPending_ = false;
    if (aborted_) return;
    aborted_ = true;
    api_.commAbort(comm_);
  }
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    try {
      CurrentDevice on(*b_, ordinal_);  // (else this thread's first call makes a context on GPU 0)
      while (!stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(queued_.empty() && !abortPending_ ? 200 : 2));
        // An NCCL call that does not return (blocked on a dead peer) cannot wait for
        // the abort that would free it: past a grace period the abort goes ahead.
        if (abortPending_ && inCall_ > 0 &&
            std::chrono::duration<double>(Clock::now() - inCallSince_).count() > std::min(timeout_, 10.0)) {
          CHORUS_LOG(LogLevel::kError, -1, "an NCCL call did not return after the communicator failed; aborting it");
          doAbortLocked();
        }
        while (!queued_.empty() && b_->query(queued_.front().done->get())) queued_.pop_front();
        if (aborted_) {
          queued_.clear();
          continue;
        }
        const auto now = Clock::now();
        if (!queued_.empty() && !queued_.front().started && b_->query(queued_.front().start->get())) {
          queued_.front().started = true;
          queued_.front().since = now;
        }
        int async = 0;
        if (api_.commGetAsyncError(comm_, &async) == kNcclSuccess && async != kNcclSuccess &&
            async != kNcclInProgress) {
          CHORUS_LOG(LogLevel::kError, -1, "NCCL reported an error on a process set's communicator ("
                                                << api_.getErrorString(async) << "); aborting it");
          abortLocked(std::make_exception_ptr(
              PeerFailure(std::string("NCCL error: ") + api_.getErrorString(async) + " (communicator aborted)")));
        } else if (!queued_.empty() && queued_.front().started &&
                   std::chrono::duration<double>(now - queued_.front().since).count() > timeout_) {
          CHORUS_LOG(LogLevel::kError, -1, "an NCCL op did not finish within the timeout; aborting the communicator");
          abortLocked(std::make_exception_ptr(
              Timeout("an NCCL op did not finish within " + std::to_string(timeout_) +
                      " s of its start on the GPU (a peer died or stopped); the communicator was aborted")));
        }
      }
    } catch (const std::exception& e) {  // (a CUDA error while polling: the device is unusable)
      CHORUS_LOG(LogLevel::kError, -1, "the NCCL watchdog hit a device error (" << e.what() << "); aborting the communicator");
      abortLocked(std::make_exception_ptr(Error(std::string("device error under NCCL: ") + e.what() +
                                                " (communicator aborted)")));
      queued_.clear();
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
  int inCall_ = 0;
  Clock::time_point inCallSince_;  // when the calls in progress began
  bool aborted_ = false, abortPending_ = false, stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<DevicePath> makeNcclPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                         Communicator& cpu, const DevicePathOptions& opts) {
  return std::make_unique<NcclPath>(backend, ordinal, cpu, opts, ncclApi());
}

std::unique_ptr<DevicePath> makeNcclPathWith(const NcclApi& api, const std::shared_ptr<DeviceBackend>& backend,
                                             int ordinal, Communicator& cpu, const DevicePathOptions& opts) {
  return std::make_unique<NcclPath>(backend, ordinal, cpu, opts, api);
}

}  // namespace chorus
