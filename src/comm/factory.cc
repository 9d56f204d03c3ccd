// The one place that chooses a backend for a group.
#include <algorithm>

#include "chorus/error.h"
#include "comm/communicator.h"
#include "comm/shm/shm_communicator.h"

namespace chorus {

std::unique_ptr<Communicator> makeCommunicator(const std::shared_ptr<TransportDevice>& device, Store& store,
                                               const std::string& storePrefix, int rank,
                                               const std::vector<std::string>& memberHosts,
                                               const CommOptions& opts) {
  const int size = static_cast<int>(memberHosts.size());
  const bool oneHost =
      std::all_of(memberHosts.begin(), memberHosts.end(), [&](const std::string& h) { return h == memberHosts[0]; });
  if (opts.cpuOperations == "shm" && !oneHost) {
    throw InvalidArgument("CHORUS_CPU_OPERATIONS=shm, but this process set spans several hosts");
  }
  if (opts.cpuOperations != "tcp" && oneHost) {
    auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
    auto seg = std::make_unique<ShmSegment>(store, storePrefix + "shm", opts.jobId, rank, size,
                                            static_cast<size_t>(opts.shmSlotBytes), ms(opts.connectTimeoutSeconds),
                                            ms(opts.timeoutSeconds));
    return std::make_unique<ShmCommunicator>(std::move(seg));
  }
  return makeTcpCommunicator(device, store, storePrefix, rank, size, opts);
}

}  // namespace chorus
