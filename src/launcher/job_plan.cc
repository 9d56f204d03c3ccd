#include "launcher/job_plan.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <stdexcept>

#include "chorus/settings.h"
#include "chorus/store.h"
#include "launcher/binding.h"
#include "launcher/hosts.h"
#include "launcher/spawn.h"
#include "base/net_address.h"

extern char** environ;

namespace chorus::launcher {

namespace {

bool forwardedByDefault(const std::string& key) {
  return key == "PATH" || key == "PYTHONPATH" || key == "LD_LIBRARY_PATH" || key.rfind("CHORUS_", 0) == 0 ||
         key.rfind("HOROVOD_", 0) == 0 || key.rfind("NCCL_", 0) == 0;
}

std::vector<HostSlots> selectHosts(const LaunchOptions& o) {
  if (!o.hosts.empty() && !o.hostfile.empty()) throw std::invalid_argument("give -H or --hostfile, not both");
  if ((o.numNodes >= 0 || o.numProcs >= 0) && (!o.include.empty() || !o.exclude.empty()))
    throw std::invalid_argument("--num_nodes/--num_gpus and --include/--exclude cannot be combined (as in DeepSpeed)");
  std::vector<HostSlots> hosts;
  if (!o.hosts.empty()) hosts = parseHostList(o.hosts);
  if (!o.hostfile.empty()) hosts = parseHostfile(o.hostfile);
  if (hosts.empty() && (o.numProcs > 0 || !o.include.empty() || !o.exclude.empty()))
    hosts.push_back({"localhost", o.numProcs > 0 ? o.numProcs : 1});
  if (o.numNodes == 0 || o.numProcs == 0) throw std::invalid_argument("--num_nodes and --num_gpus must be positive");
  if (o.numNodes > 0) {
    if (o.numNodes > static_cast<int>(hosts.size()))
      throw std::invalid_argument("--num_nodes " + std::to_string(o.numNodes) + " but the host list has " +
                                  std::to_string(hosts.size()));
    hosts.resize(o.numNodes);
  }
  if (o.numProcs > 0)
    for (auto& h : hosts) h.slots = o.numProcs;
  if (!o.include.empty()) hosts = includeHosts(hosts, o.include);
  if (!o.exclude.empty()) hosts = excludeHosts(hosts, o.exclude);
  return hosts;
}


}  // namespace

// --python, else the interpreter behind the `chorusrun` console script
// (CHORUS_PYTHON), else the one chorus was built with, else python3.
std::string pythonForScripts(const LaunchOptions& o) {
  if (!o.python.empty()) return o.python;
  std::string py;
  if (readSetting("CHORUS_PYTHON", &py) && !py.empty()) return py;
#ifdef CHORUS_DEFAULT_PYTHON
  if (access(CHORUS_DEFAULT_PYTHON, X_OK) == 0) return CHORUS_DEFAULT_PYTHON;
#endif
  return "python3";
}

// DeepSpeed's launcher runs a script with the current Python: "train.py" is
// "python -u train.py" (--no_python: run as it is; --module: python -m).
std::vector<std::string> resolveCommand(const LaunchOptions& o) {
  std::vector<std::string> c = o.command;
  if (c.empty()) throw std::invalid_argument("no command given; usage: chorusrun -np N command ...");
  const std::string python = pythonForScripts(o);
  if (o.module) {
    c.insert(c.begin(), {python, "-u", "-m"});
  } else if (!o.noPython && c[0].size() > 3 && c[0].compare(c[0].size() - 3, 3, ".py") == 0) {
    c.insert(c.begin(), {python, "-u"});
  }
  return c;
}

std::vector<std::string> rankCommand(const LaunchOptions& o, const std::vector<std::string>& command, int localRank) {
  if (!o.deepspeedForm || o.noLocalRank) return command;
  // After "python -u script" / "python -u -m module" / the program itself.
  const size_t scriptAt = command.size() - o.command.size();
  std::vector<std::string> c = command;
  c.insert(c.begin() + static_cast<std::ptrdiff_t>(scriptAt + 1), "--local_rank=" + std::to_string(localRank));
  return c;
}

std::map<std::string, std::string> torchEnvironment(const LaunchOptions& o, const std::string& storeAddr,
                                                    const std::string& rank0Host, bool rank0Local,
                                                    net::HeldPort* held) {
  std::string addr = o.masterAddr;
  if (addr.empty()) addr = rank0Local ? storeAddr : rank0Host;
  if (o.masterPort <= 0) *held = net::holdFreePort();
  const int port = o.masterPort > 0 ? o.masterPort : held->port();
  return {{"MASTER_ADDR", addr}, {"MASTER_PORT", std::to_string(port)}};
}

std::string selfPath() {
  char buf[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("cannot find chorusrun's own path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string currentDir() {
  char buf[PATH_MAX] = {0};
  return getcwd(buf, sizeof(buf)) ? buf : "/";
}

// Where the store listens: what the user chose, else the address this host
// reaches the first remote host from, else loopback.
std::string storeAddress(const LaunchOptions& o, const std::vector<std::string>& remote) {
  if (!o.masterAddr.empty()) return o.masterAddr;
  if (!o.networkInterface.empty()) return net::addressOfInterface(o.networkInterface);
  if (!o.networkPrefix.empty()) return net::addressInPrefix(o.networkPrefix);
  if (!remote.empty()) return net::sourceAddressTo(remote.front());
  return "127.0.0.1";
}

namespace {

int runMpirun(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (o.np <= 0) throw std::invalid_argument("give the number of ranks with -np N");
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(o.np), "--tag-output", "--bind-to", "none",
                                   "--map-by", "slot"};
  if (getuid() == 0) args.push_back("--allow-run-as-root");
  if (!o.hosts.empty()) args.insert(args.end(), {"-H", o.hosts});
  if (!o.hostfile.empty()) args.insert(args.end(), {"--hostfile", o.hostfile});
  if (o.ssh.port > 0 || !o.ssh.identityFile.empty() || !o.ssh.extra.empty())
    args.insert(args.end(), {"-mca", "plm_rsh_agent", sshAgentString(o.ssh)});
  std::set<std::string> keys;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (forwardedByDefault(key)) keys.insert(key);
  }
  for (const auto& k : keys) args.insert(args.end(), {"-x", k});
  for (const auto& x : o.exports) args.insert(args.end(), {"-x", x});
  if (!o.networkInterface.empty()) args.insert(args.end(), {"-x", "CHORUS_IFACE=" + o.networkInterface});
  std::istringstream extra(o.mpiArgs);
  for (std::string a; extra >> a;) args.push_back(a);
  args.insert(args.end(), command.begin(), command.end());
  return runForeground(args, o.verbose);
}

}  // namespace

std::map<std::string, std::string> rankEnvironment(int rank, int size, int localRank, int localSize, int crossRank,
                                                   int crossSize) {
  std::map<std::string, std::string> env = {
      {"CHORUS_RANK", std::to_string(rank)},           {"CHORUS_SIZE", std::to_string(size)},
      {"CHORUS_LOCAL_RANK", std::to_string(localRank)}, {"CHORUS_LOCAL_SIZE", std::to_string(localSize)},
      {"CHORUS_CROSS_RANK", std::to_string(crossRank)}, {"CHORUS_CROSS_SIZE", std::to_string(crossSize)},
  };
  // Programs written for Horovod read these ...
  for (const char* k : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"})
    env[std::string("HOROVOD_") + k] = env[std::string("CHORUS_") + k];
  // ... and these, programs written for torch.distributed and DeepSpeed.
  env["RANK"] = env["CHORUS_RANK"];
  env["WORLD_SIZE"] = env["CHORUS_SIZE"];
  env["LOCAL_RANK"] = env["CHORUS_LOCAL_RANK"];
  env["LOCAL_WORLD_SIZE"] = env["CHORUS_LOCAL_SIZE"];
  env["LOCAL_SIZE"] = env["CHORUS_LOCAL_SIZE"];
  env["CROSS_RANK"] = env["CHORUS_CROSS_RANK"];
  env["CROSS_SIZE"] = env["CHORUS_CROSS_SIZE"];
  env["GROUP_RANK"] = env["CHORUS_CROSS_RANK"];
  return env;
}

std::map<std::string, std::string> jobEnvironment(const LaunchOptions& o, const std::string& storeAddr, int storePort,
                                                  const std::string& secret) {
  std::map<std::string, std::string> env = {
      {"CHORUS_RENDEZVOUS_ADDR", storeAddr},
      {"CHORUS_RENDEZVOUS_PORT", std::to_string(storePort)},
      {"CHORUS_SECRET", secret},
      {"CHORUS_START_TIMEOUT", std::to_string(o.startTimeout)},
      {"CHORUS_JOB_ID", o.jobId},
  };
  if (!o.networkInterface.empty()) env["CHORUS_IFACE"] = o.networkInterface;
  return env;
}

RankSpec rankSpec(const LaunchOptions& o, const SshOptions& ssh, const std::string& host, bool local,
                  const std::vector<std::string>& command, std::map<std::string, std::string> env,
                  const std::string& self, const std::string& cwd) {
  RankSpec spec;
  if (local) {
    for (const auto& x : o.exports)  // -x NAME=VALUE also reaches local ranks (they inherit the rest)
      if (x.find('=') != std::string::npos) env[x.substr(0, x.find('='))] = x.substr(x.find('=') + 1);
    spec.argv = command;
    spec.env = std::move(env);
    return spec;
  }
  std::map<std::string, std::string> all = forwardedEnvironment(o.exports);
  for (const auto& [k, v] : env) all[k] = v;
  spec.argv = remoteRankArgv(ssh, host, self, cwd, command);
  spec.input = encodeEnvironment(all);
  spec.host = host;
  return spec;
}

std::map<std::string, std::string> forwardedEnvironment(const std::vector<std::string>& exports) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos && forwardedByDefault(kv.substr(0, eq))) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& x : exports) {
    const size_t eq = x.find('=');
    if (eq == 0 || x.empty()) throw std::invalid_argument("-x '" + x + "': expected NAME or NAME=VALUE");
    if (eq != std::string::npos) {
      env[x.substr(0, eq)] = x.substr(eq + 1);
    } else if (const char* v = std::getenv(x.c_str())) {
      env[x] = v;
    }
  }
  return env;
}

int launch(LaunchOptions o) {
  const std::vector<std::string> command = resolveCommand(o);
  std::vector<HostSlots> hosts = selectHosts(o);
  if (o.useMpi) return runMpirun(o, command);
  int slots = 0;
  for (const auto& h : hosts) slots += h.slots;
  if (o.np <= 0) o.np = slots;
  if (o.np <= 0) throw std::invalid_argument("give the number of ranks with -np N");
  if (!hosts.empty() && o.np > slots)
    throw std::invalid_argument(std::to_string(o.np) + " ranks requested but the hosts offer " + std::to_string(slots) +
                                " slots");
  if (hosts.empty()) hosts.push_back({"localhost", o.np});

  // Ranks fill the hosts in order, as horovodrun and mpirun --map-by slot do.
  struct Placement {
    std::string host;
    bool local;
    int localRank, localSize, crossRank;
  };
  std::vector<Placement> place;
  std::vector<std::string> remote;
  int crossSize = 0;
  for (const auto& h : hosts) {
    const int here = std::min(h.slots, o.np - static_cast<int>(place.size()));
    if (here <= 0) break;
    const bool local = isLocalHost(h.host);
    if (!local) remote.push_back(h.host);
    for (int i = 0; i < here; ++i) place.push_back({h.host, local, i, here, crossSize});
    ++crossSize;
  }
  if (!remote.empty()) {
    if (o.verbose) std::fprintf(stderr, "chorusrun: checking that %zu remote hosts answer over ssh\n", remote.size());
    checkReachable(remote, o.ssh, std::min(o.startTimeout, 30.0));
  }

  const std::string secret = generateSecret();
  if (o.jobId.empty()) o.jobId = std::to_string(getpid()) + "-" + secret.substr(0, 8);
  if (o.jobId.find_first_of("/ ") != std::string::npos) throw std::invalid_argument("--job-id may not contain '/' or spaces");
  const std::string addr = storeAddress(o, remote);
  auto server = startTcpStoreServer(addr, o.storePort, secret);
  net::HeldPort masterPort;  // until runJob returns: the job's lifetime
  const auto torchEnv = torchEnvironment(o, addr, place[0].host, place[0].local, &masterPort);

  int localCount = 0;
  for (const auto& p : place) localCount += p.local;
  const auto cpus = planBinding(o.bindTo, localCount);
  const std::string self = remote.empty() ? "" : selfPath();
  const std::string cwd = currentDir();

  Job job;
  job.keepGoing = o.keepGoing;
  if (o.ssh.port > 0) job.sshPort = o.ssh.port;
  job.verbose = o.verbose;
  job.outputDir = o.outputDir;
  for (int r = 0, l = 0; r < o.np; ++r) {
    const Placement& p = place[r];
    std::map<std::string, std::string> env = rankEnvironment(r, o.np, p.localRank, p.localSize, p.crossRank, crossSize);
    for (const auto& [k, v] : jobEnvironment(o, addr, server->port(), secret)) env[k] = v;
    for (const auto& [k, v] : torchEnv) env[k] = v;
    if (!o.eachRankLog.empty()) env["CHORUS_RANK_LOG_FILE"] = eachRankLogFile(o.eachRankLog, r);
    RankSpec spec = rankSpec(o, o.ssh, p.host, p.local, rankCommand(o, command, p.localRank), std::move(env), self, cwd);
    spec.tag = r;
    if (p.local && !cpus.empty()) spec.cpus = cpus[l++];
    job.ranks.push_back(std::move(spec));
  }
  if (o.verbose) {
    std::fprintf(stderr, "chorusrun: %d ranks on %d hosts, store on %s:%d, command:", o.np, crossSize, addr.c_str(),
                 server->port());
    for (const auto& c : command) std::fprintf(stderr, " %s", c.c_str());
    std::fprintf(stderr, "\n");
    for (int r = 0; r < o.np; ++r) {
      std::string cpuList;
      for (int c : job.ranks[r].cpus) cpuList += (cpuList.empty() ? "" : ",") + std::to_string(c);
      std::fprintf(stderr, "chorusrun: rank %d on %s%s, CPUs %s\n", r, place[r].host.c_str(),
                   place[r].local ? " (this host)" : " (over ssh)", cpuList.empty() ? "unbound" : cpuList.c_str());
    }
  }
  const int rc = runJob(job);
  // Segments are unlinked once every rank of a host has mapped them; a rank killed
  // before that leaves one behind, which goes now, here and on every remote host.
  int removed = removeJobSegments(o.jobId);
  removed += removeRemoteSegments(remote, o.ssh, self, o.jobId);
  if (removed && o.verbose) std::fprintf(stderr, "chorusrun: removed %d stale shared-memory segments\n", removed);
  return rc;
}

}  // namespace chorus::launcher
