#include "chorus/work.h"

#include "core/work_state.h"

namespace chorus {

namespace {
// Set while this thread runs ops' completion callbacks, which a cycle may run:
// an op that such a callback starts must not drive cycles from inside it.
thread_local bool tlsInCallbacks = false;
}  // namespace

void WorkState::complete(std::exception_ptr err) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (err && !error_) error_ = err;
    if (remaining_.load() > 0 && remaining_.fetch_sub(1, std::memory_order_release) == 1) callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  if (callbacks.empty()) return;
  const bool outer = tlsInCallbacks;
  tlsInCallbacks = true;
  for (auto& fn : callbacks) fn();  // outside the lock: fn may read the outputs or error()
  tlsInCallbacks = outer;
}

void WorkState::whenDone(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (remaining_.load() > 0) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

// Polled in every cycle a waiter drives: no lock. The release above pairs with
// this acquire, so the outputs written before complete() are seen.
bool WorkState::done() const { return remaining_.load(std::memory_order_acquire) == 0; }

bool WorkState::waitUnless(const std::function<bool()>* interrupted) const {
  constexpr auto kAsk = std::chrono::milliseconds(50);
  auto nextAsk = std::chrono::steady_clock::now() + kAsk;
  // Asked by time, not per cycle: a cycle is microseconds, asking (a Python
  // caller takes its interpreter lock to) is not.
  auto stop = [&] {
    if (!interrupted || std::chrono::steady_clock::now() < nextAsk) return false;
    nextAsk = std::chrono::steady_clock::now() + kAsk;
    return (*interrupted)();
  };
  if (driver) {
    if (!driverEntered.exchange(false)) driver->enter();
    bool stopped = false;
    while (!done() && driver->drive([this] { return done(); })) {
      if (stop()) {
        stopped = true;
        break;
      }
    }
    driver->leave();
    if (stopped) return false;
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kAsk, [&] { return remaining_ == 0; })) {
    lock.unlock();
    const bool quit = stop();
    lock.lock();
    if (quit) return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool WorkState::driveFor(std::chrono::microseconds budget) const {
  if (done() || !driver || tlsInCallbacks) return done();
  const auto end = std::chrono::steady_clock::now() + budget;
  auto over = [&] { return done() || std::chrono::steady_clock::now() >= end; };
  if (!driverEntered.exchange(false)) driver->enter();
  while (!over() && driver->drive(over)) {
  }
  driver->leave();
  return done();
}

bool WorkState::waitFor(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return remaining_ == 0; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

std::exception_ptr WorkState::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Work::Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
bool Work::poll() const { return state_->done(); }
void Work::wait() const { state_->wait(); }
bool Work::waitUnless(const std::function<bool()>& interrupted) const { return state_->waitUnless(&interrupted); }
bool Work::waitFor(std::chrono::milliseconds timeout) const { return state_->waitFor(timeout); }
void Work::whenDone(std::function<void()> fn) const { state_->whenDone(std::move(fn)); }
bool Work::driveFor(std::chrono::microseconds budget) const { return state_->driveFor(budget); }
const std::vector<Tensor>& Work::outputs() const { return state_->outputs; }
const std::vector<int64_t>& Work::receivedSplits() const { return state_->receivedSplits; }
int Work::joinResult() const { return state_->joinResult; }
std::exception_ptr Work::error() const { return state_->error(); }

}  // namespace chorus

namespace chorus {

void Work::streamWait(void* stream) const {
  if (const auto& e = state_->deviceDone) {
    CurrentDevice on(e->backend(), e->ordinal());  // (a null stream is the current device's)
    e->backend().streamWait(stream, e->get());
  }
}

void Work::synchronizeDevice() const {
  if (const auto& e = state_->deviceDone) e->backend().synchronize(e->get());
}

}  // namespace chorus
