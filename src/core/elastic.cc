// An elastic worker's rendezvous: its rank and size come from the driver's
// latest round that includes it, not from its environment.
#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "chorus/error.h"
#include "base/elastic_keys.h"
#include "base/logging.h"
#include "core/runtime_impl.h"

namespace chorus {

namespace {
int64_t readInt(Store& store, const std::string& key, int64_t missing) {
  if (!store.check(key)) return missing;
  const auto v = store.get(key, std::chrono::seconds(5));
  return std::stoll(std::string(v.begin(), v.end()));
}
}  // namespace

void RuntimeImpl::elasticRendezvous(Config& cfg) {
  const std::string& me = cfg.elasticWorker;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(cfg.elasticTimeoutSeconds * 1000));
  int64_t announced = -1;
  while (true) {
    const int64_t latest = readInt(*store, elastic::kRoundKey, 0);
    if (latest > elasticRound_ && store->check(elastic::roundKey(latest, me))) {
      const auto v = store->get(elastic::roundKey(latest, me), std::chrono::seconds(5));
      std::istringstream in(std::string(v.begin(), v.end()));
      if (!(in >> cfg.rank >> cfg.size >> elasticBaseUpdates_) || cfg.rank < 0 || cfg.rank >= cfg.size)
        throw Error("elastic round " + std::to_string(latest) + " gave worker " + me + " a malformed place");
      elasticRound_ = latest;
      return;
    }
    const int64_t after = std::max(latest, elasticRound_);
    if (after != announced) {  // ready for the round after `after`
      const std::string s = std::to_string(after);
      store->set(elastic::waitKey(me), std::vector<char>(s.begin(), s.end()));
      announced = after;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Timeout("elastic worker " + me + " was given no place in the job within " +
                    std::to_string(static_cast<int>(cfg.elasticTimeoutSeconds)) + " s (CHORUS_ELASTIC_TIMEOUT)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void RuntimeImpl::elasticJoin(Config& cfg) {
  store = openStore(cfg);
  elasticRound_ = std::max(elasticRound_, cfg.elasticStartRound);
  elasticRendezvous(cfg);
  elasticPending_ = {cfg.rank, cfg.size};
  CHORUS_INFO(cfg.rank, "elastic: worker " << cfg.elasticWorker << " joined round " << elasticRound_ << " as rank "
                                           << cfg.rank << " of " << cfg.size);
}

std::pair<int, int> RuntimeImpl::elasticJoinNextRound() {
  if (initialized) throw InvalidArgument("elasticJoinNextRound() is for between shutdown() and init()");
  Config cfg = Config::fromEnv();
  if (cfg.elasticWorker.empty()) throw InvalidArgument("this process is not an elastic worker (no CHORUS_ELASTIC_WORKER)");
  if (elasticPending_.first < 0) elasticJoin(cfg);
  return elasticPending_;
}

std::pair<int64_t, bool> RuntimeImpl::elasticHostUpdates() {
  requireInit();
  if (config.elasticWorker.empty() || !store->check(elastic::kUpdatedKey)) return {0, false};
  const auto v = store->get(elastic::kUpdatedKey, std::chrono::seconds(5));
  std::istringstream in(std::string(v.begin(), v.end()));
  int64_t count = 0;
  int removedOnly = 0;
  in >> count >> removedOnly;
  // Changes the current round already includes do not count.
  return {std::max<int64_t>(0, count - elasticBaseUpdates_), removedOnly != 0};
}

}  // namespace chorus
