// chorus::elastic::State and run(): the C++ side of Horovod's elastic loop.
#include <cstdio>

#include "chorus/elastic.h"
#include "chorus/error.h"

namespace chorus::elastic {

void State::commit() {
  save();
  checkHostUpdates();
}

void State::checkHostUpdates() {
  const auto [count, removedOnly] = rt_.elasticHostUpdates();
  int64_t words[3] = {lastUpdated_, count, removedOnly ? 1 : 0};  // rank 0's view for everyone
  rt_.broadcast(Tensor{words, DataType::kInt64, {3}}, 0);
  const int64_t prev = words[0];
  lastUpdated_ = words[1];
  if (lastUpdated_ > prev) throw HostsUpdatedInterrupt(words[2] != 0);
}

void State::onReset() {
  lastUpdated_ = 0;  // the new round includes every change so far
  reset();
  for (auto& fn : callbacks_) fn();
}

namespace {
// The failures a lost or stalled peer causes (Horovod's HorovodInternalError).
bool lostPeer(const Error& e) {
  return dynamic_cast<const PeerFailure*>(&e) || dynamic_cast<const ShutdownError*>(&e) ||
         dynamic_cast<const StallError*>(&e);
}

void say(int rank, const char* what) {
  std::fprintf(stderr, "chorus elastic: rank %d: %s\n", rank, what);
  std::fflush(stderr);
}
}  // namespace

void run(Runtime& rt, State& state, const std::function<void(State&)>& fn, ConfigAfterReset config) {
  const Config first = rt.config();
  bool skipSync = false;
  while (true) {
    try {
      if (!skipSync) state.sync();
      fn(state);
      return;
    } catch (const Error& e) {
      if (!lostPeer(e)) throw;  // the program's own error (a mismatch, a bad argument)
      say(rt.rank(), (std::string(e.what()) + "; rolling back to the last commit").c_str());
      state.restore();
      skipSync = false;
    } catch (const HostsUpdatedInterrupt& e) {
      say(rt.rank(), (std::string(e.what()) + "; re-forming the job").c_str());
      skipSync = e.skipSync;
    }
    rt.shutdown();
    const auto [rank, size] = rt.elasticJoinNextRound();
    (void)rank;
    Config next = config ? config(size) : first;
    if (!config) {  // static sets keep their ranks the new world has; a set left empty goes
      std::vector<std::vector<int>> kept;
      for (const auto& set : next.processSets) {
        std::vector<int> k;
        for (int r : set)
          if (r < size) k.push_back(r);
        if (!k.empty()) kept.push_back(k);
      }
      next.processSets = kept;
    }
    next.rank = next.size = -1;  // from the round
    rt.init(next);
    state.onReset();
  }
}

}  // namespace chorus::elastic
