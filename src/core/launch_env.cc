#include "core/launch_env.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "chorus/error.h"

namespace chorus {

namespace {

using Getter = std::function<const char*(const char*)>;

int parseInt(const Getter& get, const char* name, int lo, int hi) {
  const char* v = get(name);
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (!*v || *end || n < lo || n > hi)
    throw InvalidArgument(std::string("launch environment: ") + name + "='" + v + "' is not an integer in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(n);
}

std::string value(const Getter& get, const char* name) {
  const char* v = get(name);
  return v ? v : "";
}

// FNV-1a: stable across processes and builds, unlike std::hash.
std::string digest(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The job's own variables name it; with no CHORUS_SECRET they also make its
// secret, which then keeps other jobs out but not someone who can read them.
void finish(LaunchEnv& e, const Getter& get, const std::string& identity) {
  e.jobId = e.family + "-" + digest(identity);
  const std::string given = value(get, "CHORUS_SECRET");
  e.secretGiven = !given.empty();
  e.secret = e.secretGiven ? given : "derived:" + digest("secret/" + identity);
  if (get("CHORUS_RENDEZVOUS_PORT")) {  // the user's choice: that port alone
    e.storePort = parseInt(get, "CHORUS_RENDEZVOUS_PORT", 1, 65535);
    e.storePorts = {e.storePort};
    e.portSource = "CHORUS_RENDEZVOUS_PORT";
  }
  if (get("CHORUS_RENDEZVOUS_ADDR")) e.storeAddr = value(get, "CHORUS_RENDEZVOUS_ADDR");
}

std::optional<LaunchEnv> fromTorch(const Getter& get) {
  if (!get("RANK") || !get("WORLD_SIZE") || !get("MASTER_ADDR") || !get("MASTER_PORT")) return std::nullopt;
  LaunchEnv e;
  e.family = "torch";
  e.size = parseInt(get, "WORLD_SIZE", 1, 1 << 24);
  e.rank = parseInt(get, "RANK", 0, e.size - 1);
  e.storeAddr = value(get, "MASTER_ADDR");
  const int master = parseInt(get, "MASTER_PORT", 1, 65535);
  // MASTER_PORT is torch.distributed's (its TCPStore, or torchrun's agent
  // store): chorus's store takes the next one.
  // Candidates: the ports above it, then (at the top of the range) those below.
  auto room = [&e] { return static_cast<int>(e.storePorts.size()) < kStorePortCandidates; };
  for (int p = master + 1; p <= 65535 && room(); ++p) e.storePorts.push_back(p);
  for (int p = master - 1; p >= 1 && room(); --p) e.storePorts.push_back(p);
  e.storePort = e.storePorts.front();
  e.portSource = "MASTER_PORT+1";
  finish(e, get,
         "torch/" + e.storeAddr + ":" + std::to_string(master) + "/" + std::to_string(e.size) + "/" +
             value(get, "TORCHELASTIC_RUN_ID") + "/" + value(get, "TORCHELASTIC_RESTART_COUNT"));
  return e;
}

std::optional<LaunchEnv> fromSlurm(const Getter& get) {
  if (!get("SLURM_PROCID") || !get("SLURM_NTASKS")) return std::nullopt;
  LaunchEnv e;
  e.family = "slurm";
  e.size = parseInt(get, "SLURM_NTASKS", 1, 1 << 24);
  e.rank = parseInt(get, "SLURM_PROCID", 0, e.size - 1);
  std::string nodes;
  for (const char* k : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (get(k) && *get(k)) {
      nodes = get(k);
      break;
    }
  }
  if (nodes.empty())
    throw InvalidArgument("launch environment: Slurm's SLURM_PROCID is set but no SLURM_STEP_NODELIST names the "
                          "first node, where rank 0 serves the rendezvous");
  e.storeAddr = firstSlurmHost(nodes);
  const std::string job = value(get, "SLURM_JOB_ID"), step = value(get, "SLURM_STEP_ID");
  // A port every task computes alike from the job's numbers, in [20000, 40000).
  // Candidates: the next ones, round within that range.
  const int first = static_cast<int>(std::strtoull(digest(job + "." + step).c_str(), nullptr, 16) % 20000);
  for (int i = 0; i < kStorePortCandidates; ++i) e.storePorts.push_back(20000 + (first + i) % 20000);
  e.storePort = e.storePorts.front();
  e.portSource = "derived from SLURM_JOB_ID and SLURM_STEP_ID";
  finish(e, get, "slurm/" + job + "." + step + "/" + nodes + "/" + std::to_string(e.size));
  return e;
}

bool fromMpi(const Getter& get) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (get(v)) return true;
  return false;
}

}  // namespace

std::string firstSlurmHost(const std::string& nodeList) {
  // The first item ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodeList.size(); ++end) {
    if (nodeList[end] == '[') ++depth;
    if (nodeList[end] == ']') --depth;
    if (nodeList[end] == ',' && depth == 0) break;
  }
  const std::string item = nodeList.substr(0, end);
  const size_t open = item.find('[');
  if (open == std::string::npos) return item;
  const size_t close = item.find(']', open);
  if (close == std::string::npos || close == open + 1)
    throw InvalidArgument("launch environment: cannot read Slurm's node list '" + nodeList + "'");
  // "01-03,07" -> "01"; the padding stays, as Slurm writes host names.
  const std::string range = item.substr(open + 1, close - open - 1);
  const size_t stop = range.find_first_of("-,");
  return item.substr(0, open) + range.substr(0, stop) + item.substr(close + 1);
}

std::optional<LaunchEnv> detectLaunchEnv(const std::function<const char*(const char*)>& getter) {
  const Getter get = getter ? getter : Getter([](const char* n) -> const char* { return std::getenv(n); });
  if (auto e = fromTorch(get)) return e;
  if (auto e = fromSlurm(get)) return e;
  if (fromMpi(get)) {
    LaunchEnv e;
    e.family = "mpi";
    return e;
  }
  return std::nullopt;
}

}  // namespace chorus
