#include "launcher/elastic_driver.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>

#include "chorus/store.h"
#include "core/elastic_keys.h"
#include "launcher/spawn.h"
#include "launcher/supervisor.h"
#include "rendezvous/net_address.h"

namespace chorus::launcher {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs the discovery script; throws with its words when it fails.
std::string discover(const std::string& script) {
  FILE* p = popen(script.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run the host discovery script '" + script + "'");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  if (status != 0)
    throw std::runtime_error("the host discovery script '" + script + "' failed (" + describe(status, "") + ")");
  return out;
}

struct Worker {
  std::string id;  // host:slot
  std::string host;
  int slot = 0;
  int proc = -1;      // Supervisor index
  int lastRank = -1;  // its rank in the latest round it was in (-1: none yet)
  int64_t started = 0;
  bool alive = true, leaving = false, done = false;
};

struct HostState {
  int failures = 0;
  Clock::time_point lastDeath = Clock::time_point::min();
  Clock::time_point blacklistedUntil = Clock::time_point::min();
  bool blacklisted = false;
};

class Driver {
 public:
  Driver(LaunchOptions o, ElasticOptions e) : o_(std::move(o)), e_(std::move(e)) {}
  int run();

 private:
  std::vector<HostSlots> usableHosts(const std::vector<HostSlots>& found);
  void startWorker(const std::string& host, int slot);
  void updateHosts(bool first);
  void handleEnded(const Ended& e);
  void removeHost(const std::string& host, const std::string& why);
  int hostWorkers(const std::string& host) const {  // workers ever started there
    int n = 0;
    for (const auto& w : workers_) n += w.host == host;
    return n;
  }
  void bumpUpdated(bool removedOnly);
  std::vector<Worker*> members();
  bool allWaiting(const std::vector<Worker*>& m);
  void publish(const std::vector<Worker*>& m);
  int fail(const std::string& why);
  void setKey(const std::string& key, const std::string& value) {
    client_->set(key, std::vector<char>(value.begin(), value.end()));
  }

  LaunchOptions o_;
  ElasticOptions e_;
  std::vector<std::string> command_;
  std::string addr_, secret_, self_, cwd_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> client_;
  std::unique_ptr<Supervisor> sup_;
  std::vector<Worker> workers_;
  std::vector<std::string> hostOrder_;  // hosts in the order they first appeared
  std::map<std::string, HostState> hostState_;
  int64_t round_ = 0, updates_ = 0;
  int resets_ = 0;
  std::mt19937 rng_{std::random_device{}()};
};

std::vector<HostSlots> Driver::usableHosts(const std::vector<HostSlots>& found) {
  std::vector<HostSlots> out;
  for (const auto& h : found) {
    HostState& s = hostState_[h.host];
    if (s.blacklisted && Clock::now() >= s.blacklistedUntil) {
      s.blacklisted = false;
      std::fprintf(stderr, "chorusrun: host %s is back from its blacklist cooldown\n", h.host.c_str());
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
  std::map<std::string, std::string> env = jobEnvironment(o_, addr_, server_->port(), secret_);
  env["CHORUS_ELASTIC_WORKER"] = w.id;
  // A replacement keeps its predecessor's id: the round that one was in is not its.
  env["CHORUS_ELASTIC_ROUND"] = std::to_string(round_);
  env["HOROVOD_ELASTIC"] = "1";
  env["CHORUS_ELASTIC_TIMEOUT"] = std::to_string(e_.elasticTimeout);
  // A host whose link dies must count as failed soon: ssh gives up after ~6 s.
  SshOptions ssh = o_.ssh;
  ssh.extra += " -o ServerAliveInterval=2 -o ServerAliveCountMax=3";
  RankSpec spec = rankSpec(o_, ssh, host, isLocalHost(host), command_, std::move(env), self_, cwd_);
  spec.tag = static_cast<int>(workers_.size());
  w.proc = sup_->start(spec);
  if (std::find(hostOrder_.begin(), hostOrder_.end(), host) == hostOrder_.end()) hostOrder_.push_back(host);
  std::fprintf(stderr, "chorusrun: started worker %s (output tag [%d])\n", w.id.c_str(), spec.tag);
  workers_.push_back(std::move(w));
}

int Driver::fail(const std::string& why) {
  endOpenLine();
  std::fprintf(stderr, "chorusrun: %s; stopping every worker\n", why.c_str());
  sup_->signalAll(SIGTERM);
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (sup_->running() && Clock::now() < until) sup_->poll(50);
  sup_->signalAll(SIGKILL);
  while (sup_->running()) sup_->poll(50);
  return 1;
}

void Driver::bumpUpdated(bool removedOnly) {
  ++updates_;
  setKey(elastic::kUpdatedKey, std::to_string(updates_) + " " + (removedOnly ? "1" : "0"));
}

void Driver::removeHost(const std::string& host, const std::string& why) {
  HostState& s = hostState_[host];
  s.blacklisted = true;
  if (e_.cooldownMax > 0) {
    std::uniform_real_distribution<double> d(e_.cooldownMin, e_.cooldownMax);
    const double secs = d(rng_) * std::pow(2.0, std::min(s.failures - 1, 10));
    s.blacklistedUntil = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
    std::fprintf(stderr, "chorusrun: host %s is blacklisted for %.1f s (%s)\n", host.c_str(), secs, why.c_str());
  } else {
    s.blacklistedUntil = Clock::time_point::max();
    std::fprintf(stderr, "chorusrun: host %s is blacklisted (%s)\n", host.c_str(), why.c_str());
  }
  for (auto& w : workers_) {
    if (w.host != host || !w.alive || w.leaving) continue;
    w.leaving = true;  // stopped: it cannot be in any later round
    sup_->signal(w.proc, SIGTERM);
  }
  bumpUpdated(true);
}

void Driver::handleEnded(const Ended& e) {
  for (auto& w : workers_) {
    if (w.proc != e.index) continue;
    w.alive = false;
    const bool ok = WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0;
    if (ok && !w.leaving) {
      w.done = true;
      return;
    }
    if (w.leaving) return;
    endOpenLine();
    const std::string what = describe(e.status, sup_->spec(e.index).host);
    std::fprintf(stderr, "chorusrun: worker %s (rank %d) %s\n", w.id.c_str(), w.lastRank, what.c_str());
    // A worker's death is that worker's failure. Its host goes when it cannot be
    // reached (ssh's 255), when all its workers die together, or after repeated failures.
    HostState& s = hostState_[w.host];
    ++s.failures;
    const auto now = Clock::now();
    const bool together = now - s.lastDeath < std::chrono::seconds(2);
    s.lastDeath = now;
    bool othersAlive = false;
    for (const auto& o : workers_) othersAlive |= o.host == w.host && o.alive && !o.leaving;
    const bool unreachable = !isLocalHost(w.host) && WIFEXITED(e.status) && WEXITSTATUS(e.status) == 255;
    if (unreachable) {
      removeHost(w.host, "unreachable: worker " + w.id + " " + what);
    } else if (!othersAlive && (together || hostWorkers(w.host) == 1)) {
      removeHost(w.host, "all its workers died");
    } else if (s.failures >= e_.blacklistAfter) {
      removeHost(w.host, std::to_string(s.failures) + " worker failures (--blacklist-after-failures " +
                             std::to_string(e_.blacklistAfter) + ")");
    } else {
      std::fprintf(stderr, "chorusrun: host %s stays (failure %d of %d before it is blacklisted); the job goes on "
                           "with the other workers\n", w.host.c_str(), s.failures, e_.blacklistAfter);
      bumpUpdated(true);
    }
    return;
  }
}

void Driver::updateHosts(bool first) {
  std::vector<HostSlots> found = parseDiscovery(discover(e_.discoveryScript), e_.slotsPerHost);
  std::map<std::string, int> now;
  for (const auto& h : found) now[h.host] = h.slots;
  // Hosts gone from discovery: their workers leave.
  bool removed = false;
  for (auto& w : workers_) {
    if (!w.alive || w.leaving || now.count(w.host)) continue;
    if (!removed) std::fprintf(stderr, "chorusrun: host %s left the host list\n", w.host.c_str());
    w.leaving = true;
    sup_->signal(w.proc, SIGTERM);
    removed = true;
  }
  if (removed) bumpUpdated(true);
  int alive = 0;
  for (const auto& w : workers_) alive += w.alive && !w.leaving;
  const int cap = e_.maxNp > 0 ? e_.maxNp : 1 << 30;
  const int want = first && o_.np > 0 ? std::min(o_.np, cap) : cap;
  bool added = false;
  for (const auto& h : usableHosts(found)) {
    for (int slot = 0; slot < h.slots && alive < want; ++slot) {
      bool have = false;
      for (const auto& w : workers_) have |= w.alive && w.host == h.host && w.slot == slot;
      if (have) continue;
      if (!first && !added) std::fprintf(stderr, "chorusrun: host %s joins the job\n", h.host.c_str());
      startWorker(h.host, slot);
      ++alive;
      added = true;
    }
  }
  if (added && !first) bumpUpdated(false);
}

// The workers of the next round: those of the last round first, in their rank
// order (so rank 0 holds the committed state), then the new ones as started.
std::vector<Worker*> Driver::members() {
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
    const std::string key = elastic::waitKey(w->id);
    if (!client_->check(key)) return false;
    const auto v = client_->get(key, std::chrono::seconds(5));
    if (std::stoll(std::string(v.begin(), v.end())) != round_) return false;
  }
  return true;
}

void Driver::publish(const std::vector<Worker*>& m) {
  const int64_t next = round_ + 1;
  for (size_t r = 0; r < m.size(); ++r) {
    setKey(elastic::roundKey(next, m[r]->id),
           std::to_string(r) + " " + std::to_string(m.size()) + " " + std::to_string(updates_));
    m[r]->lastRank = static_cast<int>(r);
  }
  setKey(elastic::kRoundKey, std::to_string(next));
  round_ = next;
  endOpenLine();
  std::string list;
  for (const Worker* w : m) list += (list.empty() ? "" : ", ") + w->id;
  std::fprintf(stderr, "chorusrun: round %lld: %zu workers (%s)\n", static_cast<long long>(next), m.size(),
               list.c_str());
}

int Driver::run() {
  command_ = resolveCommand(o_);
  if (e_.discoveryScript.empty()) throw std::invalid_argument("elastic mode needs --host-discovery-script");
  if (e_.maxNp > 0 && e_.minNp > e_.maxNp) throw std::invalid_argument("--min-np is larger than --max-np");
  const std::vector<HostSlots> initial = parseDiscovery(discover(e_.discoveryScript), e_.slotsPerHost);
  std::vector<std::string> remote;
  for (const auto& h : initial)
    if (!isLocalHost(h.host)) remote.push_back(h.host);
  secret_ = generateSecret();
  if (o_.jobId.empty()) o_.jobId = std::to_string(getpid()) + "-" + secret_.substr(0, 8);
  addr_ = storeAddress(o_, remote);
  if (addr_ == "127.0.0.1") {
    // Hosts that join later must reach the store too: this host's first network
    // address (--network-interface chooses another).
    for (const auto& a : net::localAddresses())
      if (!a.loopback) {
        addr_ = a.address;
        break;
      }
  }
  server_ = startTcpStoreServer(addr_, o_.storePort, secret_);
  client_ = connectTcpStore(addr_, server_->port(), secret_, std::chrono::seconds(10));
  self_ = selfPath();
  cwd_ = currentDir();
  installStopHandlers();
  sup_ = std::make_unique<Supervisor>(o_.outputDir, 1000, o_.verbose);
  setKey(elastic::kUpdatedKey, "0 0");
  std::fprintf(stderr, "chorusrun: elastic job, %d to %s workers, store on %s:%d\n", e_.minNp,
               e_.maxNp > 0 ? std::to_string(e_.maxNp).c_str() : "any", addr_.c_str(), server_->port());
  updateHosts(true);

  auto lastDiscovery = Clock::now();
  auto shortSince = Clock::time_point::max();  // when the workers first fell below min-np
  int rc = 0;
  while (true) {
    for (const Ended& e : sup_->poll(50)) handleEnded(e);
    if (stopSignal()) {
      fail("interrupted (signal " + std::to_string(stopSignal()) + ")");
      rc = 128 + stopSignal();
      break;
    }
    bool anyDone = false, anyAlive = false;
    for (const auto& w : workers_) {
      anyDone |= w.done;
      anyAlive |= w.alive;
    }
    if (anyDone && !anyAlive) break;  // every worker finished
    if (anyDone) continue;            // finishing: no more rounds, the others end too
    if (since(lastDiscovery) >= e_.discoveryInterval) {
      try {
        updateHosts(false);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "chorusrun: %s\n", ex.what());
      }
      lastDiscovery = Clock::now();
    }
    const std::vector<Worker*> m = members();
    if (static_cast<int>(m.size()) < e_.minNp) {
      if (shortSince == Clock::time_point::max()) {
        shortSince = Clock::now();
        std::fprintf(stderr, "chorusrun: %zu workers, fewer than --min-np %d: waiting up to %d s (--elastic-timeout) "
                             "for the discovery script to offer usable hosts\n", m.size(), e_.minNp,
                     static_cast<int>(e_.elasticTimeout));
      }
      if (since(shortSince) > e_.elasticTimeout) {
        rc = fail("only " + std::to_string(m.size()) + " workers remain, fewer than --min-np " +
                  std::to_string(e_.minNp) + ", for more than " + std::to_string(static_cast<int>(e_.elasticTimeout)) +
                  " s (--elastic-timeout)");
        break;
      }
      continue;
    }
    shortSince = Clock::time_point::max();
    if (!allWaiting(m)) continue;
    if (round_ > 0 && e_.resetLimit >= 0 && ++resets_ > e_.resetLimit) {
      rc = fail("the job was reset " + std::to_string(resets_) + " times, more than --reset-limit " +
                std::to_string(e_.resetLimit));
      break;
    }
    publish(m);
  }
  endOpenLine();
  removeJobSegments(o_.jobId);
  std::vector<std::string> hosts;
  for (const auto& h : hostOrder_)
    if (!isLocalHost(h)) hosts.push_back(h);
  removeRemoteSegments(hosts, o_.ssh, self_, o_.jobId);
  return rc;
}

}  // namespace

std::vector<HostSlots> parseDiscovery(const std::string& text, int slotsPerHost) {
  std::vector<HostSlots> out;
  std::istringstream in(text);
  int lineNo = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineNo;
    line = line.substr(0, line.find('#'));
    std::istringstream ls(line);
    std::string item, extra;
    if (!(ls >> item)) continue;
    if (ls >> extra)
      throw std::invalid_argument("host discovery line " + std::to_string(lineNo) + ": '" + line +
                                  "' is not 'host' or 'host:slots'");
    std::vector<HostSlots> one = parseHostList(item);
    if (item.find(':') == std::string::npos) one[0].slots = slotsPerHost;
    out.push_back(one[0]);
  }
  return out;
}

int runElastic(LaunchOptions o, const ElasticOptions& e) { return Driver(std::move(o), e).run(); }

}  // namespace chorus::launcher
