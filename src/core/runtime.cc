// Runtime lifecycle, topology and process sets.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

#include <unistd.h>

#include "chorus/error.h"
#include "core/launch_env.h"
#include "base/logging.h"
#include "core/metrics_server.h"
#include "core/runtime_impl.h"
#include "device/loader.h"
#include "base/net_address.h"
#include "base/wire.h"

namespace chorus {

namespace {
std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// A timeline path with %r: every rank writes its own, %r its rank (the sets rank 0
// is not in show in their members' files); else rank 0 writes it.
bool timelineEveryRank(const std::string& path) { return path.find("%r") != std::string::npos; }

std::string timelinePath(std::string path, int rank) {
  for (size_t at; (at = path.find("%r")) != std::string::npos;) path.replace(at, 2, std::to_string(rank));
  return path;
}

}  // namespace

std::shared_ptr<Store> openStore(const Config& cfg) {
  if (cfg.store) return cfg.store;
  if (cfg.rendezvousAddr.empty() || cfg.rendezvousPort <= 0) {
    throw InvalidArgument(
        "no rendezvous store: set CHORUS_RENDEZVOUS_ADDR and CHORUS_RENDEZVOUS_PORT (chorusrun "
        "does), or pass Config::store");
  }
  return connectTcpStore(cfg.rendezvousAddr, cfg.rendezvousPort, cfg.secret, ms(cfg.startTimeoutSeconds));
}

namespace {

// Where an mpirun-started rank 0's store can be reached: the interface chosen
// for the job, else every address of rank 0's host, loopback last.
std::string storeAddresses(const std::string& iface) {
  if (!iface.empty()) return net::addressOfInterface(iface);
  std::string list;
  for (const auto& a : net::localAddresses())
    if (!a.loopback) list += a.address + ",";
  return list + "127.0.0.1";
}

// The first address of a comma-separated list that a connection reaches (each
// tried for a moment, the list again until the timeout).
std::string firstReachable(const std::string& list, int port, const std::string& secret,
                           std::chrono::milliseconds timeout) {
  std::vector<std::string> addrs;
  std::stringstream in(list);
  for (std::string a; std::getline(in, a, ',');) addrs.push_back(a);
  if (addrs.size() == 1) return addrs[0];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  do {
    for (const auto& a : addrs) {
      try {
        connectTcpStore(a, port, secret, std::chrono::milliseconds(500));  // with the handshake: not a stranger
        return a;
      } catch (const Error& e) {
        last = e.what();
      }
    }
  } while (std::chrono::steady_clock::now() < deadline);
  throw Timeout("rank 0's rendezvous store answered at none of " + list + ": " + last);
}
}  // namespace

CommOptions RuntimeImpl::commOptions() const { return commOptionsOf(config); }

CommOptions RuntimeImpl::commOptionsOf(const Config& config) {
  CommOptions o;
  o.cpuOperations = config.cpuOperations;
  o.shmDisable = config.shmDisable;
  o.shmSingleCopy = config.shmSingleCopy;
  o.shmSlotBytes = config.shmSlotBytes;
  o.shmPeerPath = config.shmPeerPath;
  o.hierarchicalAllreduce = config.hierarchicalAllreduce;
  o.hierarchicalAllgather = config.hierarchicalAllgather;
  o.jobId = config.jobId;
  o.bindAddress = config.bindAddress;
  o.iface = config.iface;
  o.timeoutSeconds = config.timeoutSeconds;
  o.connectTimeoutSeconds = config.startTimeoutSeconds;
  return o;
}

void RuntimeImpl::requireInit() const {
  if (!initialized) throw InvalidArgument("chorus is not initialized: call init() first");
}

void RuntimeImpl::init(Config cfg) {
  if (initialized) {  // as Horovod's: a second init() keeps the running runtime
    CHORUS_DEBUG(rank, "init() while initialized: nothing to do");
    return;
  }
  cfg.applyEnv();
  checkCommOptions(commOptionsOf(cfg));  // the backends' own settings, before anything starts
  names_ = std::make_shared<NameRegistry>();
  setLogLevel(cfg.logLevel);
  std::optional<LaunchEnv> launchEnv;
  if (cfg.rank < 0 && cfg.mpiCommHandle < -1 && cfg.elasticWorker.empty()) launchEnv = detectLaunchEnv();
  if (cfg.mpiCommHandle >= -1 || (launchEnv && launchEnv->family == "mpi")) {
    bootstrapFromMpi(cfg);
  } else {
    if (cfg.cpuOperations == "mpi" || cfg.controller == "mpi")
      throw InvalidArgument(std::string(cfg.cpuOperations == "mpi" ? "CHORUS_CPU_OPERATIONS" : "CHORUS_CONTROLLER") +
                            "=mpi needs the job to be started by mpirun");
    if (launchEnv) {
      bootstrapFromEnv(cfg, *launchEnv);
    } else if (cfg.rank < 0 && cfg.size < 0 && !cfg.store && cfg.rendezvousAddr.empty() && cfg.elasticWorker.empty()) {
      // No launcher at all: a world of one, as Horovod runs a plain `python train.py`.
      cfg.rank = 0;
      cfg.size = 1;
      cfg.store = makeMemoryStore();
      CHORUS_INFO(0, "no launcher found (no chorusrun, torchrun, Slurm or MPI variables): running as a world of 1");
    }
  }
  if (!cfg.elasticWorker.empty()) {
    if (elasticPending_.first < 0) elasticJoin(cfg);  // else elasticJoinNextRound() did
    cfg.rank = elasticPending_.first;
    cfg.size = elasticPending_.second;
    elasticPending_ = {-1, 0};
  }
  if (cfg.rank < 0 || cfg.size <= 0) {
    throw InvalidArgument(
        "rank and size are unknown: start the program with chorusrun (or set CHORUS_RANK and "
        "CHORUS_SIZE and the rendezvous variables, see docs/settings.md)");
  }
  if (cfg.rank >= cfg.size) {
    throw InvalidArgument("rank " + std::to_string(cfg.rank) + " is out of range for size " +
                          std::to_string(cfg.size));
  }
  config = cfg;
  rank = cfg.rank;
  size = cfg.size;
  if (cfg.elasticWorker.empty() && !cfg.store && cfg.rendezvousServer == "rank0" && rank == 0) serveRendezvous(cfg);
  if (cfg.elasticWorker.empty()) {  // (an elastic worker's joined its round through it)
    store = storePorts_.empty() ? openStore(cfg)
                                : connectTcpStoreOnFirstOf(cfg.rendezvousAddr, storePorts_, cfg.secret,
                                                           ms(cfg.startTimeoutSeconds));
    storePorts_.clear();
  }
  // Each init is a new generation so that a re-init never reads stale keys.
  if (cfg.elasticWorker.empty()) {
    const int64_t gen = store->add("chorus/generation/" + std::to_string(rank), 1);
    prefix = "chorus/g" + std::to_string(gen) + "/";
  } else {
    prefix = "chorus/e" + std::to_string(elasticRound_) + "/";  // every round meets afresh
  }
  if (config.bindAddress.empty() && config.iface.empty()) {
    // The address peers on other hosts can reach: the one towards the store.
    config.bindAddress = "127.0.0.1";
    if (!cfg.store && !cfg.rendezvousAddr.empty()) config.bindAddress = net::sourceAddressTo(cfg.rendezvousAddr);
  }
  device = makeTransportDevice(commOptions());
  // Before the first exchange, so that a bad file name fails before any rank waits on this one.
  if (!cfg.timeline.empty() && (rank == 0 || timelineEveryRank(cfg.timeline)))
    timeline->start(timelinePath(cfg.timeline, rank), cfg.timelineMarkCycles);

  std::vector<std::shared_ptr<Controller>> started;
  try {
    std::vector<int> all(size);
    for (int i = 0; i < size; ++i) all[i] = i;
    exchangeHosts();
    chooseTorchMaster();
    computeTopology();
    startP2p();
    ProcessSet globalSet(kGlobalProcessSetId, all, rank);
    auto control = makeControl(globalSet);
    auto global = makeDataComm(globalSet);
    checkStaticSetsAgree(*global);
    auto gc = std::make_shared<Controller>(kGlobalProcessSetId, all, rank, std::move(global), config,
                                           std::move(control), names_, timeline);
    gc->setOpLog(opLog);
    sets.add(globalSet, gc);
    started.push_back(gc);
    nextSetId_ = 1;
    for (const auto& ranks : config.processSets) {
      ProcessSet ps(nextSetId_++, validateRanks(ranks, size), rank);
      auto c = makeController(ps);
      sets.add(ps, c);
      if (c) started.push_back(c);
    }
  } catch (...) {
    sets.clear();
    stopP2p();
    device.reset();
    store.reset();
    discardTimeline();
    throw;
  }
  for (auto& c : started) c->start();
  initialized = true;
  if (config.metricsPort > 0) startMetrics();
}

void RuntimeImpl::startMetrics() {
  std::string bind = config.metricsBind;
  if (bind.empty()) bind = config.bindAddress.empty() ? "127.0.0.1" : config.bindAddress;
  metrics_ = std::make_unique<MetricsServer>(bind, config.metricsPort + localRank, [this] {
    std::vector<std::pair<int32_t, ProcessSetStats>> all;
    for (const auto& c : sets.controllers()) all.emplace_back(c->setId(), c->stats());
    return prometheusText(rank, size, all);
  });
  CHORUS_INFO(rank, "metrics: Prometheus text on http://" << bind << ":" << metrics_->port() << "/metrics");
}

std::unique_ptr<Communicator> RuntimeImpl::makeControl(const ProcessSet& ps) {
  if (config.controller == "mpi") return mpi_->split(ps.ranks());
  if (config.controller == "tcp" && ps.included()) {
    CommOptions o = commOptions();
    o.globalRanks = ps.ranks();
    return makeTcpCommunicator(device, *store, prefix + "ctl" + std::to_string(ps.id()) + "/", ps.rank(), ps.size(), o);
  }
  return nullptr;
}

std::unique_ptr<Communicator> RuntimeImpl::makeDataComm(const ProcessSet& ps) {
  MpiLinks links;
  if (config.cpuOperations == "mpi") {  // MPI splits are collective: every rank makes them
    std::vector<std::string> memberHosts;
    for (int r : ps.ranks()) memberHosts.push_back(hosts[r]);
    const auto byHost = groupByHost(memberHosts);
    links.flat = mpi_->split(ps.ranks());
    // One cross communicator per local index on evenly filled hosts, else the leaders'.
    const size_t indices = evenHosts(byHost) ? byHost[0].size() : 1;
    for (size_t i = 0; i < indices; ++i) {
      std::vector<int> members;
      for (const auto& h : byHost) members.push_back(ps.ranks()[h[i]]);
      if (auto c = mpi_->split(members)) links.cross = std::move(c);
    }
  }
  if (!ps.included()) return nullptr;
  std::vector<std::string> memberHosts;
  for (int r : ps.ranks()) memberHosts.push_back(hosts[r]);
  CommOptions o = commOptions();
  o.globalRanks = ps.ranks();
  auto comm = makeCommunicator(device, *store, prefix + "ps" + std::to_string(ps.id()) + "/", ps.rank(), memberHosts,
                               o, std::move(links));
  if (comm) {
    const size_t nHosts = groupByHost(memberHosts).size();
    CHORUS_INFO(rank, "process set " << ps.id() << ": " << ps.size() << " ranks on " << nHosts << " host(s), data path "
                                     << comm->traits().transport << " (CHORUS_CPU_OPERATIONS=" << config.cpuOperations
                                     << (nHosts > 1 ? "; across hosts" : "; one host: shared memory unless disabled")
                                     << ")");
  }
  return comm;
}

std::shared_ptr<Controller> RuntimeImpl::makeController(const ProcessSet& ps) {
  auto control = makeControl(ps);
  auto comm = makeDataComm(ps);
  if (!comm) return nullptr;
  auto c = std::make_shared<Controller>(ps.id(), ps.ranks(), rank, std::move(comm), config, std::move(control),
                                        names_, timeline);
  c->setOpLog(opLog);
  return c;
}

void RuntimeImpl::bootstrapFromMpi(Config& cfg) {
  mpi_ = openBootstrap("mpi", cfg.mpiCommHandle < -1 ? -1 : cfg.mpiCommHandle,
                       cfg.cpuOperations == "mpi" || cfg.controller == "mpi");
  cfg.rank = mpi_->rank();
  cfg.size = mpi_->size();
  if (cfg.store) return;
  // Rank 0 serves the rendezvous store; MPI carries its address and secret.
  std::string info;
  if (cfg.rank == 0) {
    const std::string secret = generateSecret();
    storeServer_ = startTcpStoreServer("0.0.0.0", 0, secret);
    info = storeAddresses(cfg.iface) + "\n" + std::to_string(storeServer_->port()) + "\n" + secret;
  }
  info = mpi_->broadcastString(info, 0);
  std::istringstream in(info);
  std::string port;
  std::getline(in, cfg.rendezvousAddr);
  std::getline(in, port);
  std::getline(in, cfg.secret);
  cfg.rendezvousPort = std::stoi(port);
  cfg.rendezvousAddr = firstReachable(cfg.rendezvousAddr, cfg.rendezvousPort, cfg.secret, ms(cfg.startTimeoutSeconds));
  if (cfg.jobId == "nojob") cfg.jobId = "mpi-" + cfg.secret.substr(0, 12);
}

// Started by torchrun, a cluster that sets torch.distributed's variables, or
// Slurm: rank 0 serves the store at the address and port every rank derives.
void RuntimeImpl::bootstrapFromEnv(Config& cfg, const LaunchEnv& env) {
  cfg.rank = env.rank;
  cfg.size = env.size;
  if (cfg.jobId == "nojob") cfg.jobId = env.jobId;
  const std::string candidates =
      env.storePorts.size() > 1 ? ", or the next free of " + std::to_string(env.storePorts.size()) + " candidates" : "";
  CHORUS_INFO(cfg.rank, "started by " << env.family << ": rank " << env.rank << " of " << env.size << ", store at "
                                      << env.storeAddr << ":" << env.storePort << " (" << env.portSource
                                      << candidates << "), "
                                      << (env.secretGiven ? "secret from CHORUS_SECRET" : "secret derived from the job's variables"));
  if (cfg.store) return;
  cfg.rendezvousAddr = env.storeAddr;
  cfg.rendezvousPort = env.storePort;
  cfg.secret = env.secret;
  if (cfg.rank == 0) {
    try {
      // A port given is served as it is; a derived one may be taken: the next free candidate.
      storeServer_ = env.storePorts.size() > 1 ? startTcpStoreServerOnFirstFree("0.0.0.0", env.storePorts, env.secret)
                                               : startTcpStoreServer("0.0.0.0", env.storePort, env.secret);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (chorus's rendezvous port under " + env.family + " is " + env.portSource +
                  "; choose another with CHORUS_RENDEZVOUS_PORT)");
    }
    cfg.rendezvousPort = storeServer_->port();
  } else if (env.storePorts.size() > 1) {
    storePorts_ = env.storePorts;  // which of them rank 0 got, the handshake tells
  }
}

// Rank 0 of a job a cluster engine started (chorus.spark, chorus.ray) serves the
// store on the port its starter held for it (see net::HeldPort).
void RuntimeImpl::serveRendezvous(const Config& cfg) {
  if (cfg.secret.empty() || cfg.rendezvousPort <= 0)
    throw InvalidArgument("CHORUS_RENDEZVOUS_SERVER=rank0 needs CHORUS_RENDEZVOUS_PORT and CHORUS_SECRET");
  storeServer_.reset();  // an init that failed before may have left one on this port
  try {
    storeServer_ = startTcpStoreServer("0.0.0.0", cfg.rendezvousPort, cfg.secret);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (rank 0 serves the rendezvous store on CHORUS_RENDEZVOUS_PORT=" +
                std::to_string(cfg.rendezvousPort) + ")");
  }
}

void RuntimeImpl::chooseTorchMaster() {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (config.elasticWorker.empty() && addr && *addr && port && *port) {
    torchMaster_ = {addr, std::atoi(port)};
    return;
  }
  const std::string key = prefix + "torch_master";
  if (rank == 0) {
    std::string host = config.bindAddress;
    if (host.empty() && !config.iface.empty()) host = net::addressOfInterface(config.iface);
    if (host.empty()) host = "127.0.0.1";
    torchPortHeld_ = net::holdFreePort();  // held until shutdown: torch's TCPStore binds beside it
    const std::string v = host + " " + std::to_string(torchPortHeld_.port());
    store->set(key, std::vector<char>(v.begin(), v.end()));
  }
  const auto v = store->get(key, ms(config.startTimeoutSeconds));
  std::istringstream in(std::string(v.begin(), v.end()));
  in >> torchMaster_.first >> torchMaster_.second;
}

void RuntimeImpl::exchangeHosts() {
  // Through the store, before any communicator exists: the host names decide the data path.
  CHORUS_DEBUG(rank, "rendezvous: " << prefix << " as rank " << rank << " of " << size << " on " << config.hostname);
  store->set(prefix + "host/" + std::to_string(rank), std::vector<char>(config.hostname.begin(), config.hostname.end()));
  hosts.assign(size, "");
  for (int r = 0; r < size; ++r) {
    auto v = store->get(prefix + "host/" + std::to_string(r), ms(config.startTimeoutSeconds));
    hosts[r].assign(v.begin(), v.end());
  }
}

void RuntimeImpl::computeTopology() {
  const std::string& host = config.hostname;
  std::vector<std::string> order;  // hosts in order of their first rank
  std::map<std::string, std::vector<int>> byHost;
  for (int r = 0; r < size; ++r) {
    if (!byHost.count(hosts[r])) order.push_back(hosts[r]);
    byHost[hosts[r]].push_back(r);
  }
  const auto& mine = byHost[host];
  localSize = static_cast<int>(mine.size());
  localRank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  // Cross communicator, as Horovod: the ranks with my local rank, one per host.
  crossRank = 0;
  crossSize = 0;
  homogeneous = true;
  for (const auto& h : order) {
    const auto& rs = byHost[h];
    if (rs.size() != mine.size()) homogeneous = false;
    if (static_cast<int>(rs.size()) > localRank) {
      if (h == host) crossRank = crossSize;
      ++crossSize;
    }
  }
}

void RuntimeImpl::checkStaticSetsAgree(Communicator& global) {
  std::ostringstream os;
  for (const auto& s : config.processSets) os << listString(s) << ";";
  std::string mine = os.str();
  std::vector<uint64_t> lenWords(size, 0);
  lenWords[rank] = mine.size();
  global.allreduceBitsOr(lenWords.data(), size);
  std::vector<size_t> lens(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) total += lens[r] = static_cast<size_t>(lenWords[r]);
  std::vector<char> all(std::max<size_t>(total, 1));
  global.allgatherv(mine.data(), all.data(), lens);
  size_t off = 0;
  std::string first(all.data(), lens[0]);
  for (int r = 0; r < size; ++r) {
    std::string theirs(all.data() + off, lens[r]);
    off += lens[r];
    if (theirs != first) {
      throw InvalidArgument("init: the process sets differ between ranks: rank 0 gave {" + first +
                            "} but rank " + std::to_string(r) + " gave {" + theirs + "}");
    }
  }
}

void RuntimeImpl::agree(const std::string& op, const std::string& what) {
  const int64_t seq = ++dynamicSeq_;
  const std::string base = prefix + "dynamic/" + std::to_string(seq) + "/";
  store->set(base + std::to_string(rank), std::vector<char>(what.begin(), what.end()));
  std::map<std::string, std::vector<int>> seen;
  for (int r = 0; r < size; ++r) {
    auto v = store->get(base + std::to_string(r), ms(config.startTimeoutSeconds));
    seen[std::string(v.begin(), v.end())].push_back(r);
  }
  if (seen.size() > 1) {
    std::ostringstream os;
    os << op << " must be called with the same arguments on every rank, in the same order; got";
    for (const auto& [value, ranks] : seen) os << " " << value << " on ranks " << listString(ranks) << ";";
    throw InvalidArgument(os.str());
  }
}

ProcessSet RuntimeImpl::addProcessSet(const std::vector<int>& ranks) {
  requireInit();
  if (!config.dynamicProcessSets) {
    throw InvalidArgument(
        "add_process_set needs dynamic process sets: init with process_sets=\"dynamic\" "
        "(Config::dynamicProcessSets, CHORUS_DYNAMIC_PROCESS_SETS=1)");
  }
  auto sorted = validateRanks(ranks, size);
  agree("add_process_set", "add " + listString(sorted));
  if (int32_t existing = sets.find(sorted); existing >= 0) {
    throw InvalidArgument("a process set with ranks " + listString(sorted) + " already exists (id " +
                          std::to_string(existing) + ")");
  }
  ProcessSet ps(nextSetId_++, sorted, rank);
  auto c = makeController(ps);
  sets.add(ps, c);
  if (c) c->start();
  return ps;
}

void RuntimeImpl::removeProcessSet(int32_t id) {
  requireInit();
  if (id == kGlobalProcessSetId) throw InvalidArgument("the global process set (id 0) cannot be removed");
  if (!config.dynamicProcessSets) {
    throw InvalidArgument("remove_process_set needs dynamic process sets: init with process_sets=\"dynamic\"");
  }
  sets.get(id);  // throws when unknown
  agree("remove_process_set", "remove " + std::to_string(id));
  auto c = sets.remove(id);
  if (c) {
    c->requestShutdown();
    c->join();
  }
}

void RuntimeImpl::shutdown() {
  if (!initialized) return;
  metrics_.reset();
  auto controllers = sets.controllers();
  for (auto& c : controllers) c->requestShutdown();
  for (auto& c : controllers) c->join();
  sets.clear();
  controllers.clear();
  stopP2p();
  try {
    timeline->stop();
  } catch (const Error& e) {
    CHORUS_WARN(rank, e.what());
  }
  device.reset();
  store.reset();
  storeServer_.reset();
  torchPortHeld_.release();
  mpi_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.clear();
    outstanding_.clear();
  }
  dynamicSeq_ = 0;
  initialized = false;
}

// ---- Runtime facade over RuntimeImpl ----

Runtime::Runtime() : impl_(std::make_unique<RuntimeImpl>()) {}
Runtime::~Runtime() {
  try {
    impl_->shutdown();
  } catch (...) {
  }
}
void Runtime::init(Config config) { impl_->init(std::move(config)); }
void Runtime::shutdown() { impl_->shutdown(); }

void RuntimeImpl::discardTimeline() {
  try {
    timeline->stop();
  } catch (const Error&) {
    // init is failing already; that error is the one to report
  }
}

void Runtime::startTimeline(const std::string& path, bool markCycles) {
  impl_->requireInit();
  if (impl_->rank == 0 || timelineEveryRank(path)) impl_->timeline->start(timelinePath(path, impl_->rank), markCycles);
}

void Runtime::stopTimeline() {
  impl_->requireInit();
  impl_->timeline->stop();
}
bool Runtime::isInitialized() const { return impl_->initialized; }
#define CHORUS_GETTER(type, fn, field) \
  type Runtime::fn() const {           \
    impl_->requireInit();              \
    return impl_->field;               \
  }
CHORUS_GETTER(int, rank, rank)
CHORUS_GETTER(int, size, size)
CHORUS_GETTER(int, localRank, localRank)
CHORUS_GETTER(int, localSize, localSize)
CHORUS_GETTER(int, crossRank, crossRank)
CHORUS_GETTER(int, crossSize, crossSize)
CHORUS_GETTER(bool, isHomogeneous, homogeneous)
#undef CHORUS_GETTER
bool Runtime::mpiEnabled() const { return impl_->initialized && impl_->mpiWorld() != nullptr; }
bool Runtime::mpiThreadsSupported() const { return mpiEnabled() && impl_->mpiWorld()->threadsMultiple(); }
std::pair<std::string, int> Runtime::torchMaster() const {
  impl_->requireInit();
  return impl_->torchMaster_;
}
bool Runtime::glooEnabled() const { return impl_->initialized && impl_->config.controller != "mpi"; }
const Config& Runtime::config() const { return impl_->config; }
ProcessSet Runtime::globalProcessSet() const { return processSet(kGlobalProcessSetId); }
ProcessSet Runtime::processSet(int32_t id) const {
  impl_->requireInit();
  return impl_->sets.get(id);
}
std::vector<ProcessSet> Runtime::processSets() const {
  impl_->requireInit();
  return impl_->sets.all();
}
ProcessSet Runtime::addProcessSet(const std::vector<int>& ranks) { return impl_->addProcessSet(ranks); }
void Runtime::removeProcessSet(int32_t id) { impl_->removeProcessSet(id); }
ProcessSetStats Runtime::stats(int32_t processSet) const {
  impl_->requireInit();
  return impl_->sets.controllerFor(processSet, impl_->rank)->stats();
}
void Runtime::synchronize() { impl_->synchronize(); }
void Runtime::setOpLog(bool on) { impl_->opLog->set(on); }
std::vector<OpRecord> Runtime::takeOpLog(bool settle) { return impl_->opLog->take(settle); }
std::shared_ptr<void> Runtime::waitingElsewhere(int32_t processSet) {
  std::shared_ptr<CycleDriver> driver = impl_->sets.controllerFor(processSet, impl_->rank)->driver();
  driver->park();
  return std::shared_ptr<void>(nullptr, [driver](void*) { driver->unpark(); });
}
std::pair<int64_t, bool> Runtime::elasticHostUpdates() { return impl_->elasticHostUpdates(); }
std::pair<int, int> Runtime::elasticJoinNextRound() { return impl_->elasticJoinNextRound(); }

}  // namespace chorus

namespace chorus {

std::shared_ptr<DeviceBackend> RuntimeImpl::deviceBackend() {
  return backendOrCuda(config.device);
}

}  // namespace chorus
