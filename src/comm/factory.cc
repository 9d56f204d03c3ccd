// The one place that chooses a backend for a group.
#include <algorithm>

#include "chorus/error.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/hierarchical/hierarchical_communicator.h"
#include "comm/mpi/mpi_world.h"
#include "comm/shm/peer_path.h"
#include "comm/shm/shm_communicator.h"

namespace chorus {

void checkCommOptions(const CommOptions& opts) {
  parsePeerPath(opts.shmPeerPath);  // throws on a bad value, naming the setting
  if (opts.shmSlotBytes < 4096) throw InvalidArgument("CHORUS_SHM_SLOT_BYTES must be at least 4096");
}

std::string launcherBootstrap() { return launchedByMpi() ? "mpi" : ""; }

std::unique_ptr<Bootstrap> openBootstrap(const std::string& kind, int64_t handle, bool needThreads) {
  if (kind == "mpi") return openMpiWorld(handle, needThreads);
  throw InvalidArgument("no bootstrap for launcher '" + kind + "'");
}

std::vector<std::vector<int>> groupByHost(const std::vector<std::string>& memberHosts) {
  std::vector<std::string> names;
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < static_cast<int>(memberHosts.size()); ++r) {
    auto it = std::find(names.begin(), names.end(), memberHosts[r]);
    if (it == names.end()) {
      names.push_back(memberHosts[r]);
      groups.emplace_back();
      it = names.end() - 1;
    }
    groups[it - names.begin()].push_back(r);
  }
  return groups;
}

bool evenHosts(const std::vector<std::vector<int>>& hostRanks) {
  for (const auto& h : hostRanks)
    if (h.size() != hostRanks[0].size()) return false;
  return true;
}

std::unique_ptr<Communicator> makeCommunicator(const std::shared_ptr<TransportDevice>& device, Store& store,
                                               const std::string& storePrefix, int rank,
                                               const std::vector<std::string>& memberHosts,
                                               const CommOptions& opts, MpiLinks mpi) {
  const int size = static_cast<int>(memberHosts.size());
  const bool oneHost =
      std::all_of(memberHosts.begin(), memberHosts.end(), [&](const std::string& h) { return h == memberHosts[0]; });
  if (opts.cpuOperations == "shm" && !oneHost) {
    throw InvalidArgument("CHORUS_CPU_OPERATIONS=shm, but this process set spans several hosts");
  }
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  auto makeShm = [&](const std::string& prefix, int r, int n) -> std::unique_ptr<Communicator> {
    auto seg = std::make_unique<ShmSegment>(store, prefix + "shm", opts.jobId, r, n,
                                            static_cast<size_t>(opts.shmSlotBytes), ms(opts.connectTimeoutSeconds),
                                            ms(opts.timeoutSeconds), opts.shmSingleCopy);
    return std::make_unique<ShmCommunicator>(std::move(seg), parsePeerPath(opts.shmPeerPath));
  };
  const bool viaMpi = opts.cpuOperations == "mpi";
  if (opts.cpuOperations == "tcp") return makeTcpCommunicator(device, store, storePrefix, rank, size, opts);
  if (viaMpi && (opts.shmDisable || size == 1)) return std::move(mpi.flat);
  if (oneHost) return makeShm(storePrefix, rank, size);

  // Spanning hosts.
  HierarchyLayout layout;
  layout.rank = rank;
  layout.hostRanks = groupByHost(memberHosts);
  for (size_t h = 0; h < layout.hostRanks.size(); ++h)
    if (memberHosts[layout.hostRanks[h][0]] == memberHosts[rank]) layout.host = static_cast<int>(h);
  bool crowded = false;
  for (const auto& h : layout.hostRanks) crowded |= h.size() > 1;
  const bool hierAllreduce = opts.hierarchicalAllreduce < 0 ? crowded : opts.hierarchicalAllreduce > 0;
  const bool hierAllgather = opts.hierarchicalAllgather < 0 ? crowded : opts.hierarchicalAllgather > 0;
  if (!hierAllreduce && !hierAllgather) {
    return viaMpi ? std::move(mpi.flat) : makeTcpCommunicator(device, store, storePrefix, rank, size, opts);
  }

  const auto& mine = layout.hostRanks[layout.host];
  const int localRank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  auto local = makeShm(storePrefix + "local" + std::to_string(layout.host) + "/", localRank,
                       static_cast<int>(mine.size()));
  // Across hosts: the ranks of each local index when the hosts hold as many
  // ranks each (every rank carries a slice), else the hosts' first ranks.
  std::unique_ptr<Communicator> cross;
  if (localRank == 0 || evenHosts(layout.hostRanks)) {
    CommOptions crossOpts = opts;  // its members' global ranks, for messages
    crossOpts.globalRanks.clear();
    for (const auto& h : layout.hostRanks) {
      const int member = h[std::min<size_t>(static_cast<size_t>(localRank), h.size() - 1)];
      crossOpts.globalRanks.push_back(opts.globalRanks.empty() ? member : opts.globalRanks[member]);
    }
    cross = viaMpi ? std::move(mpi.cross)
                   : makeTcpCommunicator(device, store, storePrefix + "cross" + std::to_string(localRank) + "/",
                                         layout.host, static_cast<int>(layout.hostRanks.size()), crossOpts);
  }
  auto flat = viaMpi ? std::move(mpi.flat) : makeTcpCommunicator(device, store, storePrefix + "flat/", rank, size, opts);
  return std::make_unique<HierarchicalCommunicator>(std::move(layout), std::move(local), std::move(cross),
                                                    std::move(flat), hierAllreduce, hierAllgather);
}

}  // namespace chorus
