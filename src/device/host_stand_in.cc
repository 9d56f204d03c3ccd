#include "device/host_stand_in.h"

#include <atomic>
#include <condition_variable>
#include <sys/mman.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "chorus/error.h"
#include "reduce/half.h"
#include "reduce/reduce.h"
#include "reduce/cast.h"
#include "reduce/cpu_optimizer.h"

namespace chorus {

namespace {

// A stream: a thread running its queue in order.
class Stream {
 public:
  explicit Stream(int device) : device_(device), thread_([this] { loop(); }) {}
  int device() const { return device_; }
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
      ++queued_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_;
    cv_.wait(lock, [&] { return ran_ >= target; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
      ++ran_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t queued_ = 0, ran_ = 0;
  bool stop_ = false;
  const int device_;
  std::thread thread_;
};

// An event: the generation of its last record, and the latest one completed.
struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  int device = 0;
  void waitFor(uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= gen; });
  }
};

class HostStandIn final : public DeviceBackend {
 public:
  explicit HostStandIn(HostStandInOptions opts) : opts_(std::move(opts)), id_(++instances_) {
    // Device addresses come from a reserved range the host cannot touch: host
    // code that reads or writes device memory faults here as it would on a GPU.
    void* r = ::mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) throw Error("host stand-in: cannot reserve its device address range");
    reserved_ = reinterpret_cast<uintptr_t>(r);
    for (int d = 0; d < std::max(1, opts_.devices); ++d) defaults_.push_back(std::make_unique<Stream>(d));
  }
  ~HostStandIn() override {
    for (auto& d : defaults_) d->drain();
    defaults_.clear();
    for (auto& [p, a] : device_) std::free(a.real);
    ::munmap(reinterpret_cast<void*>(reserved_), kReserved);
  }
  // The host memory behind a device address (other addresses unchanged).
  void* real(const void* p) const {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    if (addr < reserved_ || addr >= reserved_ + kReserved) return const_cast<void*>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_.upper_bound(addr);
    if (it == device_.begin()) throw Error("host stand-in: an address in the device range that was never allocated");
    --it;
    if (addr > it->first + std::max<size_t>(it->second.bytes, 1))
      throw Error("host stand-in: a device address past the end of its allocation");
    return static_cast<char*>(it->second.real) + (addr - it->first);
  }
  const char* name() const override { return "host stand-in"; }
  std::string version() const override { return "host stand-in (no GPU)"; }
  int count() const override { return opts_.devices; }
  int current() const override {
    const int c = threadCurrent();
    return c < 0 ? 0 : c;  // (CUDA's answer before any device was made current; no context made)
  }
  void setCurrent(int ordinal) override {
    checkOrdinal(ordinal);
    checkBroken();
    threadCurrent() = ordinal;
    touchContext(ordinal);
  }
  bool active(int ordinal) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return contexts_.count(ordinal) > 0;
  }
  std::string identity(int ordinal) const override {
    checkOrdinal(ordinal);
    return opts_.identityPrefix + std::to_string(ordinal);
  }
  int deviceOf(const void* p) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = device_.upper_bound(addr);
    if (it == device_.begin()) return -1;
    --it;
    return addr < it->first + std::max<size_t>(it->second.bytes, 1) ? it->second.ordinal : -1;
  }
  void* allocDevice(int ordinal, size_t bytes) override {
    onDevice(ordinal);
    void* mem = std::calloc(1, std::max<size_t>(bytes, 1));
    if (!mem) throw Error("host stand-in: out of memory allocating " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> lock(mu_);
    const size_t span = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    if (next_ + span > kReserved) {
      std::free(mem);
      throw Error("host stand-in: its device address range is used up");
    }
    const uintptr_t addr = reserved_ + next_;
    next_ += span;
    device_[addr] = {bytes, ordinal, mem};
    return reinterpret_cast<void*>(addr);
  }
  void freeDevice(void* p) override {
    if (!p) return;
    live();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_.find(reinterpret_cast<uintptr_t>(p));
    if (it == device_.end()) throw InvalidArgument("host stand-in: freeDevice of unknown pointer");
    std::free(it->second.real);
    device_.erase(it);
  }
  void* allocPinned(size_t bytes) override {
    live();
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = std::max<size_t>(bytes, 1);
    return p;
  }
  void freePinned(void* p) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pinned_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }

  void* createStream(int ordinal) override {
    onDevice(ordinal);
    return new Stream(ordinal);
  }
  void destroyStream(void* s) override { delete static_cast<Stream*>(s); }
  // An event outlives its handle while work queued on a stream refers to it
  // (as cudaEventDestroy allows).
  void* createEvent(int ordinal) override {
    onDevice(ordinal);
    auto e = std::make_shared<Event>();
    e->device = ordinal;
    return new std::shared_ptr<Event>(std::move(e));
  }
  void destroyEvent(void* e) override { delete static_cast<std::shared_ptr<Event>*>(e); }
  void record(void* event, void* stream) override {
    live();
    std::shared_ptr<Event> e = ev(event);
    Stream* s = on(stream);
    if (s->device() != e->device)
      throw Error("host stand-in: an event of device " + std::to_string(e->device) + " recorded on a stream of device " +
                  std::to_string(s->device()) + " (CUDA refuses it: cudaErrorInvalidResourceHandle)");
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = ++e->recorded;
    }
    s->push([e, gen] {
      {
        std::lock_guard<std::mutex> lock(e->mu);
        e->completed = std::max(e->completed, gen);
      }
      e->cv.notify_all();
    });
  }
  void streamWait(void* stream, void* event) override {
    live();
    std::shared_ptr<Event> e = ev(event);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = e->recorded;
    }
    on(stream)->push([e, gen] { e->waitFor(gen); });
  }
  bool query(void* event) override {
    live();
    Event* e = ev(event).get();
    std::lock_guard<std::mutex> lock(e->mu);
    return e->completed >= e->recorded;
  }
  void synchronize(void* event) override {
    live();
    Event* e = ev(event).get();
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = e->recorded;
    }
    e->waitFor(gen);
  }
  void synchronizeStream(void* stream) override {
    live();
    on(stream)->drain();
  }

  void copy(void* dst, const void* src, size_t bytes, void* stream) override {
    live();
    if (bytes) on(stream)->push([=, this] { std::memcpy(real(dst), real(src), bytes); });
  }
  void zero(void* dst, size_t bytes, void* stream) override {
    reach(dst, "memset");
    live();
    if (bytes) on(stream)->push([=, this] { std::memset(real(dst), 0, bytes); });
  }
  void batchedCopy(const CopyItem* items, size_t n, void* stream) override {
    std::vector<CopyItem> copy(items, items + n);
    for (const CopyItem& c : copy) reach(c.dst, "batched copy"), reach(c.src, "batched copy");
    kernel(stream, "batched copy")->push([this, copy = std::move(copy)] {
      for (const CopyItem& c : copy)
        if (c.bytes) std::memcpy(real(c.dst), real(c.src), c.bytes);
    });
  }
  void scale(DataType dtype, void* dst, const void* src, size_t n, double factor, void* stream) override {
    kernel(stream, "scale", {dst, src})->push([=, this] { scaleCopy(dtype, real(dst), real(src), n, factor); });
  }
  void divide(DataType dtype, void* buf, size_t n, int64_t divisor, void* stream) override {
    kernel(stream, "divide", {buf})->push([=, this] { divideBuffer(dtype, real(buf), n, divisor); });
  }
  void cast(DataType to, void* dst, DataType from, const void* src, size_t n, void* stream) override {
    kernel(stream, "cast", {dst, src})->push([=, this] { castElements(to, real(dst), from, real(src), n); });
  }
  void reduce(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, void* stream) override {
    kernel(stream, "reduce", {dst, src})->push(
        [=, this] { reduceBuffers(dtype, op == ReduceOp::kAverage ? ReduceOp::kSum : op, real(dst), real(dst), real(src), n); });
  }

  void adam(const AdamCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors, size_t n,
            void* stream) override {
    optimizerKernel(stream, "adam", gradDtype, tensors, n, [=, this](const OptimTensor& t, const float* grad) {
      cpuAdamStep(c, static_cast<float*>(real(t.master)), grad, static_cast<float*>(real(t.state1)),
                        static_cast<float*>(real(t.state2)), t.n, t.low ? real(t.low) : nullptr, lowDtype);
    });
  }
  void sgd(const SgdCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors, size_t n,
           void* stream) override {
    optimizerKernel(stream, "sgd", gradDtype, tensors, n, [=, this](const OptimTensor& t, const float* grad) {
      float* p = static_cast<float*>(real(t.master));
      cpuSgdStep(c, p, grad, static_cast<float*>(real(t.state1)), t.n);
      if (t.low) fromFloat(real(t.low), p, lowDtype, t.n);
    });
  }
  // The CPU step on each tensor, its gradients in float32 first.
  template <typename Step>
  void optimizerKernel(void* stream, const char* what, DataType gradDtype, const OptimTensor* tensors, size_t n,
                       Step step) {
    std::vector<OptimTensor> ts(tensors, tensors + n);
    for (const OptimTensor& t : ts)
      for (const void* p : {static_cast<const void*>(t.master), static_cast<const void*>(t.state1),
                            static_cast<const void*>(t.state2), t.grad, static_cast<const void*>(t.low)})
        reach(p, what);
    kernel(stream, what)->push([=, this, ts = std::move(ts)] {
      std::vector<float> g;
      for (const OptimTensor& t : ts) {
        const float* grad = static_cast<const float*>(real(t.grad));
        if (gradDtype != DataType::kFloat32) {
          g.resize(t.n);
          toFloat(g.data(), grad, gradDtype, t.n);
          grad = g.data();
        }
        step(t, grad);
      }
    });
  }
  void sumSquares(DataType dtype, const void* src, size_t n, double* out, void* stream) override {
    kernel(stream, "sum of squares", {src, out})->push(
        [=, this] { *static_cast<double*>(real(out)) += chorus::sumSquares(real(src), dtype, n); });
  }

  void enqueue(void* stream, std::function<void()> fn) { on(stream)->push(std::move(fn)); }
  std::vector<int> contexts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {contexts_.begin(), contexts_.end()};
  }
  void breakWith(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = message;
  }

 private:
  struct Alloc {
    size_t bytes;
    int ordinal;
    void* real;  // the host memory behind it
  };
  static constexpr size_t kReserved = size_t{64} << 30;
  void checkOrdinal(int ordinal) const {
    if (ordinal < 0 || ordinal >= opts_.devices)
      throw InvalidArgument("host stand-in: device " + std::to_string(ordinal) + " does not exist (" +
                            std::to_string(opts_.devices) + " devices)");
  }
  // The calling thread's current device of this stand-in (-1: none made current yet).
  int& threadCurrent() const {
    thread_local std::map<uint64_t, int> current;
    return current.try_emplace(id_, -1).first->second;
  }
  void touchContext(int ordinal) const {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.insert(ordinal);
  }
  // A call that needs a context: a thread with none made current gets device 0's, as in CUDA.
  void live() const {
    checkBroken();
    int& c = threadCurrent();
    if (c < 0) {
      c = 0;
      touchContext(0);
    }
  }
  // As chorus's CUDA backend does for calls naming a device: that device is
  // current for the call, and the previous one comes back only if it has a context.
  void onDevice(int ordinal) {
    checkOrdinal(ordinal);
    checkBroken();
    const bool zeroLive = active(0);
    touchContext(ordinal);
    int& c = threadCurrent();
    if (c < 0) c = zeroLive ? 0 : ordinal;  // (asking which device is current makes no context)
  }
  void checkBroken() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) throw Error(broken_);
  }
  // A kernel reaches device memory and pinned host memory (mapped, as CUDA's
  // unified addressing maps it), never pageable host memory.
  void reach(const void* p, const char* what) const {
    if (!p) return;
    const auto addr = reinterpret_cast<uintptr_t>(p);
    if (addr >= reserved_ && addr < reserved_ + kReserved) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pinned_.upper_bound(addr);
    if (it != pinned_.begin() && addr < std::prev(it)->first + std::prev(it)->second) return;
    throw Error(std::string("host stand-in: a ") + what +
                " kernel was given pageable host memory, which a GPU kernel cannot reach");
  }
  Stream* kernel(void* stream, const char* what, std::initializer_list<const void*> ptrs = {}) {
    for (const void* p : ptrs) reach(p, what);
    live();
    Stream* s = on(stream);
    if (s->device() != threadCurrent())
      throw Error(std::string("host stand-in: a ") + what + " kernel launched on a stream of device " +
                  std::to_string(s->device()) + " while device " + std::to_string(threadCurrent()) +
                  " is current (CUDA refuses it)");
    return s;
  }
  static const std::shared_ptr<Event>& ev(void* handle) { return *static_cast<std::shared_ptr<Event>*>(handle); }
  Stream* on(void* stream) {
    if (stream) return static_cast<Stream*>(stream);
    const int c = threadCurrent();
    return defaults_.at(c < 0 ? 0 : c).get();
  }

  HostStandInOptions opts_;
  const uint64_t id_;
  static std::atomic<uint64_t> instances_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Alloc> device_;  // by device address
  std::map<uintptr_t, size_t> pinned_;  // allocPinned's blocks
  uintptr_t reserved_ = 0;
  size_t next_ = 0;
  mutable std::set<int> contexts_;
  std::string broken_;
  std::vector<std::unique_ptr<Stream>> defaults_;
};

std::atomic<uint64_t> HostStandIn::instances_{0};

}  // namespace

std::shared_ptr<DeviceBackend> makeHostStandIn(HostStandInOptions opts) {
  return std::make_shared<HostStandIn>(std::move(opts));
}

namespace {
HostStandIn& standIn(DeviceBackend& b, const char* what) {
  auto* s = dynamic_cast<HostStandIn*>(&b);
  if (!s) throw InvalidArgument(std::string(what) + ": not the host stand-in");
  return *s;
}
}  // namespace

void* standInHostAddress(DeviceBackend& b, const void* p) { return standIn(b, "standInHostAddress").real(p); }

std::vector<int> standInContexts(DeviceBackend& b) { return standIn(b, "standInContexts").contexts(); }

void standInBreak(DeviceBackend& b, const std::string& message) { standIn(b, "standInBreak").breakWith(message); }

void standInEnqueue(DeviceBackend& b, void* stream, std::function<void()> fn) {
  standIn(b, "standInEnqueue").enqueue(stream, std::move(fn));
}

}  // namespace chorus
