#include "launcher/elastic_driver.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>

#include "launcher/spawn.h"
#include "launcher/supervisor.h"
#include "rendezvous/elastic_rounds.h"
#include "base/net_address.h"

namespace chorus::launcher {

namespace {

using Clock = std::chrono::steady_clock;

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

// The elastic driver's workers as processes: local ones, or ranks of ssh's agent.
class ProcessPool : public elastic::WorkerPool {
 public:
  ProcessPool(const LaunchOptions& o, const ElasticOptions& e, Supervisor& sup)
      : o_(o), e_(e), sup_(sup), command_(resolveCommand(o)), self_(selfPath()), cwd_(currentDir()) {}

  void attach(const elastic::Driver& d) { driver_ = &d; }

  std::vector<elastic::Host> discover() override {
    std::vector<elastic::Host> out;
    for (const auto& h : parseDiscovery(launcher::discover(e_.discoveryScript), e_.slotsPerHost))
      out.push_back({h.host, h.slots});
    return out;
  }

  int start(const std::string& id, const std::string& host, int,
            const std::map<std::string, std::string>& elasticEnv) override {
    std::map<std::string, std::string> env =
        jobEnvironment(o_, driver_->storeAddr(), driver_->storePort(), driver_->secret());
    for (const auto& [k, v] : elasticEnv) env[k] = v;
    // A host whose link dies must count as failed soon: ssh gives up after ~6 s.
    SshOptions ssh = o_.ssh;
    ssh.extra += " -o ServerAliveInterval=2 -o ServerAliveCountMax=3";
    RankSpec spec = rankSpec(o_, ssh, host, isLocalHost(host), command_, std::move(env), self_, cwd_);
    spec.tag = started_++;
    const int index = sup_.start(spec);
    endOpenLine();
    std::fprintf(stderr, "chorusrun: started worker %s (output tag [%d])\n", id.c_str(), spec.tag);
    return index;
  }

  void stop(int handle) override { sup_.signal(handle, SIGTERM); }

  void stopAll() override {
    sup_.signalAll(SIGTERM);
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (sup_.running() && Clock::now() < until) sup_.poll(50);
    sup_.signalAll(SIGKILL);
    while (sup_.running()) sup_.poll(50);
  }

  void log(const std::string& line) override {
    endOpenLine();
    std::fprintf(stderr, "%s\n", line.c_str());
  }

  elastic::WorkerEnd ended(const Ended& e) const {
    const std::string host = sup_.spec(e.index).host;
    elastic::WorkerEnd w;
    w.handle = e.index;
    w.ok = WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0;
    w.what = describe(e.status, host);
    w.unreachable = !host.empty() && !isLocalHost(host) && WIFEXITED(e.status) && WEXITSTATUS(e.status) == 255;
    return w;
  }

 private:
  const LaunchOptions& o_;
  const ElasticOptions& e_;
  Supervisor& sup_;
  std::vector<std::string> command_;
  std::string self_, cwd_;
  const elastic::Driver* driver_ = nullptr;
  int started_ = 0;
};

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

int runElastic(LaunchOptions o, const ElasticOptions& e) {
  if (e.discoveryScript.empty()) throw std::invalid_argument("elastic mode needs --host-discovery-script");
  if (e.maxNp > 0 && e.minNp > e.maxNp) throw std::invalid_argument("--min-np is larger than --max-np");
  const std::vector<HostSlots> initial = parseDiscovery(discover(e.discoveryScript), e.slotsPerHost);
  std::vector<std::string> remote;
  for (const auto& h : initial)
    if (!isLocalHost(h.host)) remote.push_back(h.host);
  if (o.jobId.empty()) o.jobId = std::to_string(getpid()) + "-" + generateSecret().substr(0, 8);
  std::string addr = storeAddress(o, remote);
  if (addr == "127.0.0.1") {
    // Hosts that join later must reach the store too: this host's first network
    // address (--network-interface chooses another).
    for (const auto& a : net::localAddresses())
      if (!a.loopback) {
        addr = a.address;
        break;
      }
  }
  elastic::Options opts;
  opts.minNp = e.minNp;
  opts.maxNp = e.maxNp;
  opts.initialNp = o.np;
  opts.resetLimit = e.resetLimit;
  opts.cooldownMin = e.cooldownMin;
  opts.cooldownMax = e.cooldownMax;
  opts.elasticTimeout = e.elasticTimeout;
  opts.blacklistAfter = e.blacklistAfter;
  opts.discoveryInterval = e.discoveryInterval;
  installStopHandlers();
  Supervisor sup(o.outputDir, 1000, o.verbose);
  ProcessPool pool(o, e, sup);
  elastic::Driver driver(opts, pool, addr, addr, o.storePort);
  pool.attach(driver);
  driver.begin();
  int rc = 0;
  while (true) {
    std::vector<elastic::WorkerEnd> ended;
    for (const Ended& x : sup.poll(50)) ended.push_back(pool.ended(x));
    if (stopSignal()) {
      driver.abort("interrupted (signal " + std::to_string(stopSignal()) + ")");
      rc = 128 + stopSignal();
      break;
    }
    if (const auto done = driver.step(ended)) {
      rc = *done;
      break;
    }
  }
  endOpenLine();
  removeJobSegments(o.jobId);
  std::vector<std::string> hosts;
  for (const auto& h : driver.hosts())
    if (!isLocalHost(h)) hosts.push_back(h);
  removeRemoteSegments(hosts, o.ssh, selfPath(), o.jobId);
  return rc;
}

}  // namespace chorus::launcher
