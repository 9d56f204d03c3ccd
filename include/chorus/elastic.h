#pragma once
// Elastic training for C++ programs, as horovod's elastic API: a State that is
// committed, restored after a failure and synchronized from rank 0 after every
// reset, and run(), the loop that re-forms the job. Run under
// `chorusrun --min-np N --max-np M --host-discovery-script S` (docs/launching.md);
// libtorch programs use chorus::torch_api::TorchState (chorus/torch.h).
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include "chorus/runtime.h"

namespace chorus::elastic {

// Raised by State::commit() / checkHostUpdates() on every rank at the same commit
// when the driver's host set changed; skipSync: hosts were only removed.
class HostsUpdatedInterrupt : public std::runtime_error {
 public:
  explicit HostsUpdatedInterrupt(bool skipSync)
      : std::runtime_error(skipSync ? "the job's hosts changed (removed only)" : "the job's hosts changed"),
        skipSync(skipSync) {}
  bool skipSync;
};

class State {
 public:
  explicit State(Runtime& rt) : rt_(rt) {}
  virtual ~State() = default;

  virtual void save() = 0;     // the point a failure rolls back to
  virtual void restore() = 0;  // back to the last save
  virtual void sync() = 0;     // everyone takes rank 0's (collective)
  virtual void reset() {}      // after the job re-formed, before sync

  // save(), then checkHostUpdates().
  void commit();
  // Throws HostsUpdatedInterrupt on every rank at once when hosts changed since
  // the round began (rank 0's view decides; collective).
  void checkHostUpdates();
  void registerResetCallback(std::function<void()> fn) { callbacks_.push_back(std::move(fn)); }
  void onReset();  // reset(), then the callbacks

 protected:
  Runtime& rt_;

 private:
  int64_t lastUpdated_ = 0;
  std::vector<std::function<void()>> callbacks_;
};

// The config for init() after a reset, given the new world size (process sets
// chosen for it); by default the one rt was first initialized with, its static
// process sets keeping the ranks the new world has (a set left empty goes).
using ConfigAfterReset = std::function<Config(int size)>;

// Horovod's elastic loop: state.sync(), then fn(state); when a peer fails
// (PeerFailure, Timeout, ShutdownError, StallError) state.restore(); on
// HostsUpdatedInterrupt the committed state stands. Either way rt leaves its
// round, joins the next one the driver forms, calls state.onReset() and starts
// over. Returns when fn returns.
void run(Runtime& rt, State& state, const std::function<void(State&)>& fn, ConfigAfterReset config = nullptr);

}  // namespace chorus::elastic
