#include "rendezvous/elastic_rounds.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "base/elastic_keys.h"

namespace chorus::elastic {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

void WorkerPool::log(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

struct Driver::Worker {
  std::string id;  // host:slot
  std::string host;
  int slot = 0;
  int handle = -1;
  int lastRank = -1;  // its rank in the latest round it was in (-1: none yet)
  int64_t started = 0;
  bool alive = true, leaving = false, done = false;
};

struct Driver::HostState {
  int failures = 0;
  Clock::time_point lastDeath = Clock::time_point::min();
  Clock::time_point blacklistedUntil = Clock::time_point::min();
  bool blacklisted = false;
};

Driver::Driver(Options o, WorkerPool& pool, const std::string& bindAddr, const std::string& advertisedAddr, int port)
    : o_(std::move(o)), pool_(pool), addr_(advertisedAddr), secret_(generateSecret()) {
  if (o_.maxNp > 0 && o_.minNp > o_.maxNp)
    throw std::invalid_argument(o_.name + ": the fewest workers (" + std::to_string(o_.minNp) +
                                ") is more than the most (" + std::to_string(o_.maxNp) + ")");
  server_ = startTcpStoreServer(bindAddr, port, secret_);
  client_ = connectTcpStore(addr_, server_->port(), secret_, std::chrono::seconds(10));
  setKey(kUpdatedKey, "0 0");
  shortSince_ = Clock::time_point::max();
}

Driver::~Driver() = default;

std::map<std::string, std::string> Driver::storeEnvironment() const {
  return {{"CHORUS_RENDEZVOUS_ADDR", addr_},
          {"CHORUS_RENDEZVOUS_PORT", std::to_string(server_->port())},
          {"CHORUS_SECRET", secret_}};
}

void Driver::setKey(const std::string& key, const std::string& value) {
  client_->set(key, std::vector<char>(value.begin(), value.end()));
}

int Driver::hostWorkers(const std::string& host) const {  // workers ever started there
  int n = 0;
  for (const auto& w : workers_) n += w.host == host;
  return n;
}

std::vector<Host> Driver::usableHosts(const std::vector<Host>& found) {
  std::vector<Host> out;
  for (const auto& h : found) {
    HostState& s = hostState_[h.name];
    if (s.blacklisted && Clock::now() >= s.blacklistedUntil) {
      s.blacklisted = false;
      pool_.log(o_.name + ": host " + h.name + " is back from its blacklist cooldown");
    }
    if (!s.blacklisted) out.push_back(h);
  }
  return out;
}

void Driver::startWorker(const std::string& host, int slot) {
  Worker w;
  w.host = host;
  w.slot = slot;
  w.id = host + ":" + std::to_string(slot);
  w.started = static_cast<int64_t>(workers_.size());
  std::map<std::string, std::string> env = storeEnvironment();
  env["CHORUS_ELASTIC_WORKER"] = w.id;
  // A replacement keeps its predecessor's id: the round that one was in is not its.
  env["CHORUS_ELASTIC_ROUND"] = std::to_string(round_);
  env["HOROVOD_ELASTIC"] = "1";
  env["CHORUS_ELASTIC_TIMEOUT"] = std::to_string(o_.elasticTimeout);
  w.handle = pool_.start(w.id, host, slot, env);
  if (std::find(hostOrder_.begin(), hostOrder_.end(), host) == hostOrder_.end()) hostOrder_.push_back(host);
  workers_.push_back(std::move(w));
}

int Driver::fail(const std::string& why) {
  failure_ = why;
  pool_.log(o_.name + ": " + why + "; stopping every worker");
  pool_.stopAll();
  return 1;
}

int Driver::abort(const std::string& why) { return fail(why); }

void Driver::bumpUpdated(bool removedOnly) {
  ++updates_;
  setKey(kUpdatedKey, std::to_string(updates_) + " " + (removedOnly ? "1" : "0"));
}

void Driver::removeHost(const std::string& host, const std::string& why) {
  HostState& s = hostState_[host];
  s.blacklisted = true;
  char text[64];
  if (o_.cooldownMax > 0) {
    std::uniform_real_distribution<double> d(o_.cooldownMin, o_.cooldownMax);
    const double secs = d(rng_) * std::pow(2.0, std::min(s.failures - 1, 10));
    s.blacklistedUntil = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
    std::snprintf(text, sizeof(text), "%.1f", secs);
    pool_.log(o_.name + ": host " + host + " is blacklisted for " + text + " s (" + why + ")");
  } else {
    s.blacklistedUntil = Clock::time_point::max();
    pool_.log(o_.name + ": host " + host + " is blacklisted (" + why + ")");
  }
  for (auto& w : workers_) {
    if (w.host != host || !w.alive || w.leaving) continue;
    w.leaving = true;  // stopped: it cannot be in any later round
    pool_.stop(w.handle);
  }
  bumpUpdated(true);
}

void Driver::handleEnded(const WorkerEnd& e) {
  for (auto& w : workers_) {
    if (w.handle != e.handle || !w.alive) continue;
    w.alive = false;
    if (e.ok && !w.leaving) {
      w.done = true;
      return;
    }
    if (w.leaving) return;
    pool_.log(o_.name + ": worker " + w.id + " (rank " + std::to_string(w.lastRank) + ") " + e.what);
    // A worker's death is that worker's failure. Its host goes when it cannot be
    // reached, when all its workers die together, or after repeated failures.
    HostState& s = hostState_[w.host];
    ++s.failures;
    const auto now = Clock::now();
    const bool together = now - s.lastDeath < std::chrono::seconds(2);
    s.lastDeath = now;
    bool othersAlive = false;
    for (const auto& o : workers_) othersAlive |= o.host == w.host && o.alive && !o.leaving;
    if (e.unreachable) {
      removeHost(w.host, "unreachable: worker " + w.id + " " + e.what);
    } else if (!othersAlive && (together || hostWorkers(w.host) == 1)) {
      removeHost(w.host, "all its workers died");
    } else if (s.failures >= o_.blacklistAfter) {
      removeHost(w.host, std::to_string(s.failures) + " worker failures (" + o_.blacklistWord + " " +
                             std::to_string(o_.blacklistAfter) + ")");
    } else {
      pool_.log(o_.name + ": host " + w.host + " stays (failure " + std::to_string(s.failures) + " of " +
                std::to_string(o_.blacklistAfter) + " before it is blacklisted); the job goes on with the other workers");
      bumpUpdated(true);
    }
    return;
  }
}

void Driver::updateHosts(bool first) {
  const std::vector<Host> found = pool_.discover();
  std::map<std::string, int> now;
  for (const auto& h : found) now[h.name] = h.slots;
  // Hosts gone from discovery: their workers leave.
  bool removed = false;
  for (auto& w : workers_) {
    if (!w.alive || w.leaving || now.count(w.host)) continue;
    if (!removed) pool_.log(o_.name + ": host " + w.host + " left the host list");
    w.leaving = true;
    pool_.stop(w.handle);
    removed = true;
  }
  if (removed) bumpUpdated(true);
  int alive = 0;
  for (const auto& w : workers_) alive += w.alive && !w.leaving;
  const int cap = o_.maxNp > 0 ? o_.maxNp : 1 << 30;
  const int want = first && o_.initialNp > 0 ? std::min(o_.initialNp, cap) : cap;
  bool added = false;
  try {
    for (const auto& h : usableHosts(found)) {
      for (int slot = 0; slot < h.slots && alive < want; ++slot) {
        bool have = false;
        for (const auto& w : workers_) have |= w.alive && w.host == h.name && w.slot == slot;
        if (have) continue;
        if (!first && !added) pool_.log(o_.name + ": host " + h.name + " joins the job");
        startWorker(h.name, slot);
        ++alive;
        added = true;
      }
    }
  } catch (...) {
    // The workers started before the failure joined: the others must hear of them.
    if (added && !first) bumpUpdated(false);
    throw;
  }
  if (added && !first) bumpUpdated(false);
}

// The workers of the next round: those of the last round first, in their rank
// order (so rank 0 holds the committed state), then the new ones as started.
std::vector<Driver::Worker*> Driver::members() {
  std::vector<Worker*> m;
  for (auto& w : workers_)
    if (w.alive && !w.leaving) m.push_back(&w);
  std::stable_sort(m.begin(), m.end(), [](const Worker* a, const Worker* b) {
    const int ra = a->lastRank < 0 ? 1 << 30 : a->lastRank, rb = b->lastRank < 0 ? 1 << 30 : b->lastRank;
    return ra != rb ? ra < rb : a->started < b->started;
  });
  return m;
}

bool Driver::allWaiting(const std::vector<Worker*>& m) {
  for (const Worker* w : m) {
    const std::string key = waitKey(w->id);
    if (!client_->check(key)) return false;
    const auto v = client_->get(key, std::chrono::seconds(5));
    if (std::stoll(std::string(v.begin(), v.end())) != round_) return false;
  }
  return true;
}

void Driver::publish(const std::vector<Worker*>& m) {
  const int64_t next = round_ + 1;
  for (size_t r = 0; r < m.size(); ++r) {
    setKey(roundKey(next, m[r]->id),
           std::to_string(r) + " " + std::to_string(m.size()) + " " + std::to_string(updates_));
    m[r]->lastRank = static_cast<int>(r);
  }
  setKey(kRoundKey, std::to_string(next));
  round_ = next;
  std::string list;
  for (const Worker* w : m) list += (list.empty() ? "" : ", ") + w->id;
  pool_.log(o_.name + ": round " + std::to_string(next) + ": " + std::to_string(m.size()) + " workers (" + list + ")");
}

void Driver::begin() {
  pool_.log(o_.name + ": elastic job, " + std::to_string(o_.minNp) + " to " +
            (o_.maxNp > 0 ? std::to_string(o_.maxNp) : std::string("any")) + " workers, store on " + addr_ + ":" +
            std::to_string(server_->port()));
  updateHosts(true);
  lastDiscovery_ = Clock::now();
}

std::optional<int> Driver::step(const std::vector<WorkerEnd>& ended) {
  for (const WorkerEnd& e : ended) handleEnded(e);
  bool anyDone = false, anyAlive = false;
  for (const auto& w : workers_) {
    anyDone |= w.done;
    anyAlive |= w.alive;
  }
  if (anyDone && !anyAlive) return 0;  // every worker finished
  if (anyDone) return std::nullopt;    // finishing: no more rounds, the others end too
  if (since(lastDiscovery_) >= o_.discoveryInterval) {
    try {
      updateHosts(false);
    } catch (const std::runtime_error& ex) {  // discovery or a start failed; the next turn tries again
      pool_.log(o_.name + ": " + ex.what());
    } catch (const std::invalid_argument& ex) {  // discovery's output unreadable
      pool_.log(o_.name + ": " + ex.what());
    }
    lastDiscovery_ = Clock::now();
  }
  const std::vector<Worker*> m = members();
  if (static_cast<int>(m.size()) < o_.minNp) {
    if (shortSince_ == Clock::time_point::max()) {
      shortSince_ = Clock::now();
      pool_.log(o_.name + ": " + std::to_string(m.size()) + " workers, fewer than " + o_.minNpWord + " " +
                std::to_string(o_.minNp) + ": waiting up to " + std::to_string(static_cast<int>(o_.elasticTimeout)) +
                " s (" + o_.timeoutWord + ") for discovery to offer usable hosts");
    }
    if (since(shortSince_) > o_.elasticTimeout)
      return fail("only " + std::to_string(m.size()) + " workers remain, fewer than " + o_.minNpWord + " " +
                  std::to_string(o_.minNp) + ", for more than " + std::to_string(static_cast<int>(o_.elasticTimeout)) +
                  " s (" + o_.timeoutWord + ")");
    return std::nullopt;
  }
  shortSince_ = Clock::time_point::max();
  if (!allWaiting(m)) return std::nullopt;
  if (round_ > 0 && o_.resetLimit >= 0 && ++resets_ > o_.resetLimit)
    return fail("the job was reset " + std::to_string(resets_) + " times, more than " + o_.resetLimitWord + " " +
                std::to_string(o_.resetLimit));
  publish(m);
  return std::nullopt;
}

}  // namespace chorus::elastic
