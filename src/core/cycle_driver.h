#pragma once
// Lets threads that wait for an op run its process set's cycles themselves,
// instead of waking the controller thread and being woken back by it: those two
// hand-offs are most of a small collective's cost. While any thread waits here,
// the controller thread leaves the cycles to it.
#include <atomic>
#include <functional>
#include <mutex>
#include <shared_mutex>

namespace chorus {

class CycleDriver {
 public:
  struct Hooks {
    // Runs one cycle unless done() holds once it may; false once the set has stopped.
    std::function<bool(const std::function<bool()>& done)> run;
    std::function<void()> lastLeft;  // no thread waits any more
  };
  explicit CycleDriver(Hooks hooks) : hooks_(std::move(hooks)) {}

  void enter() { waiting_.fetch_add(1); }
  void leave() {
    if (waiting_.fetch_sub(1) != 1) return;
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (hooks_.lastLeft) hooks_.lastLeft();
  }
  int waiting() const { return waiting_.load(); }
  // A thread that waits for the set's ops by other means (a framework's executor
  // completing them through callbacks): blocked for the blocked-ranks check, but
  // it runs no cycles, so the controller thread keeps running them.
  void park() { parked_.fetch_add(1); }
  void unpark() { parked_.fetch_sub(1); }
  int parked() const { return parked_.load(); }

  // False once detached or stopped: the waiter then just waits.
  bool drive(const std::function<bool()>& done) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return hooks_.run && hooks_.run(done);
  }
  // The controller is going away; returns once no thread is inside a hook.
  void detach() {
    std::unique_lock<std::shared_mutex> lock(mu_);
    hooks_ = {};
  }

 private:
  std::shared_mutex mu_;
  Hooks hooks_;
  std::atomic<int> waiting_{0};
  std::atomic<int> parked_{0};
};

}  // namespace chorus
