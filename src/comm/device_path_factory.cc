// The one place that chooses a process set's path for CUDA tensors.
#include <algorithm>
#include <cctype>
#include <map>

#include "chorus/error.h"
#include "comm/device_path.h"
#include "comm/nccl/nccl_api.h"
#include "base/logging.h"

namespace chorus {

std::unique_ptr<DevicePath> makeNcclPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                         Communicator& cpu, const DevicePathOptions& opts);

namespace {

// Every rank's string, in rank order (two small collectives on the CPU path).
std::vector<std::string> gatherStrings(Communicator& cpu, const std::string& mine) {
  const int n = cpu.size();
  uint64_t len = mine.size();
  std::vector<uint64_t> lens(n);
  cpu.allgatherv(&len, lens.data(), std::vector<size_t>(n, sizeof len));
  std::vector<size_t> bytes(lens.begin(), lens.end());
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::string all(std::max<size_t>(total, 1), '\0');
  cpu.allgatherv(mine.data(), all.data(), bytes);
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t b : bytes) {
    out.push_back(all.substr(at, b));
    at += b;
  }
  return out;
}

std::string mode(const std::string& setting) {
  std::string m = setting;
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  if (m.empty() || m == "auto") return "auto";
  if (m == "nccl") return "nccl";
  if (m == "host" || m == "staged" || m == "mpi" || m == "gloo" || m == "cpu") return "host";
  throw InvalidArgument("CHORUS_GPU_OPERATIONS (HOROVOD_GPU_OPERATIONS) is '" + setting +
                        "': use auto, nccl or host (mpi and gloo are read as host)");
}

}  // namespace

std::unique_ptr<DevicePath> makeDevicePath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                           Communicator& cpu, const std::string& hostOf,
                                           const DevicePathOptions& opts, std::string* why) {
  const std::string want = mode(opts.gpuOperations);
  std::string ncclError;
  int nccl = 0;
  const bool cuda = std::string(backend->name()) == "cuda";  // (NCCL runs on CUDA streams only)
  if (!cuda) ncclError = std::string("the device backend is the ") + backend->name() + ", not CUDA";
  if (want != "host" && cuda) {
    try {
      nccl = ncclApi().version;
    } catch (const Error& e) {
      ncclError = e.what();
    }
  }
  // host|GPU identity|NCCL version of every rank.
  const std::vector<std::string> all =
      gatherStrings(cpu, hostOf + "|" + backend->identity(ordinal) + "|" + std::to_string(nccl));
  std::map<std::string, std::vector<int>> byGpu;
  bool everyNccl = true;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const size_t bar = all[r].rfind('|');
    byGpu[all[r].substr(0, bar)].push_back(r);
    everyNccl &= all[r].substr(bar + 1) != "0";
  }
  std::string shared;
  for (const auto& [gpu, ranks] : byGpu) {
    if (ranks.size() < 2 || !shared.empty()) continue;
    shared = "ranks";
    for (int r : ranks) shared += " " + std::to_string(r);
    shared += " of the set share GPU " + gpu.substr(gpu.find('|') + 1) + " on " + gpu.substr(0, gpu.find('|'));
  }
  std::string reason;
  bool useNccl = false;
  if (want == "host") {
    reason = "CHORUS_GPU_OPERATIONS asks for host staging";
  } else if (!shared.empty()) {
    reason = shared + " (NCCL refuses a GPU shared by two ranks)";
  } else if (!everyNccl) {
    reason = nccl ? "NCCL is missing on another rank of the set" : "NCCL is missing here: " + ncclError;
  } else {
    useNccl = true;
    reason = "every rank has a GPU of its own; NCCL " + std::to_string(nccl / 10000) + "." +
             std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  }
  if (want == "nccl" && !useNccl) throw InvalidArgument("CHORUS_GPU_OPERATIONS=nccl cannot be met: " + reason);
  if (why) *why = reason;
  const HostSplit split = cpu.hostSplit();
  if (useNccl && want == "auto" && split.local && split.cross) {
    // Across hosts: NCCL within each host, the set's own TCP/MPI path between
    // them (CHORUS_GPU_OPERATIONS=nccl asks for NCCL across hosts instead).
    if (why) *why = reason + "; by hosts: NCCL within each host, " + split.cross->traits().transport + " between them";
    auto local = makeNcclPath(backend, ordinal, *split.local, opts);
    auto cross = makeStagedPath(backend, ordinal, *split.cross, opts);
    auto flat = makeNcclPath(backend, ordinal, cpu, opts);
    return makeHierarchicalPath(backend, ordinal, std::move(local), std::move(cross), std::move(flat),
                                split.local->rank(), split.local->size());
  }
  if (useNccl) return makeNcclPath(backend, ordinal, cpu, opts);
  if (cpu.rank() == 0 && want != "host")
    CHORUS_WARN(-1, "CUDA tensors of a " << cpu.size() << "-rank process set are staged through pinned host memory: "
                                         << reason);
  return makeStagedPath(backend, ordinal, cpu, opts);
}

}  // namespace chorus
