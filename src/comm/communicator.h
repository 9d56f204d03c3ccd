#pragma once
// What the algorithms see of a backend: a group of ranks and blocking
// collectives on raw host buffers. Each call either completes on every rank or
// throws (PeerFailure / Timeout) within the configured timeout.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "chorus/types.h"

namespace chorus {

// A tensor's buffer in a fused collective.
struct Span {
  void* data;
  size_t count;              // elements
  const void* src = nullptr;  // the input, when it is not already in data
  const void* input() const { return src ? src : data; }
};

// Copies each span's input into its data where the two differ (for paths that
// reduce in place).
void copySpanInputs(const std::vector<Span>& spans, size_t elementBytes);

// What a transport is like, for the layers above (none of it changes results).
struct CommTraits {
  // What the timeline calls the transport: SHM, TCP, MPI, HIERARCHICAL.
  const char* transport = "TCP";
  // reducescatter only reads buf: the caller may hand it the input itself.
  bool reducescatterReadsOnly = false;
  // A negotiation cycle is expensive (network round trips): after busy cycles the
  // controller lets requests accumulate for a cycle time, so that they fuse.
  bool batchesRequests = false;
  // Allreduces larger than this run in chunks of it, one per negotiation cycle,
  // so that a higher-priority op that becomes ready meanwhile goes first: about
  // 50x the cost of a cycle, so that preemption costs the big op ~2%.
  size_t preemptChunkBytes = 4u << 20;
};

// A negotiation that carries a small op's input along (speculatively: the
// controller uses it only if every rank sent the same op), offered by transports
// that can keep every rank's payload readable until their next collective.
class NegotiationPayload {
 public:
  virtual ~NegotiationPayload() = default;
  // How many payload bytes fit beside `words` words.
  virtual size_t payloadCapacity(size_t words) const = 0;
  // allreduceBitsOr, with `bytes` of payload published beside the words.
  virtual void allreduceBitsOrWithPayload(uint64_t* words, size_t count, const void* payload, size_t bytes) = 0;
  // Rank r's payload of the negotiation just before, readable until the next
  // collective: the op that went with it is done from there, with no exchange.
  virtual const char* payloadOf(int r) const = 0;
};

// Transport settings that autotune may change between two collectives (every
// rank applies the same values before the same collective). A field a
// transport does not have reads -1 (0 for the slot sizes).
struct CommTuning {
  int peerPath = -1;               // shared memory: 0 auto, 1 through caches, 2 through memory
  int64_t slotBytes = 0;           // shared memory: bytes per pipelined round (a power of two)
  int64_t maxSlotBytes = 0;        // (read only) the segment's slot
  int hierarchicalAllreduce = -1;  // sets across hosts with several ranks on one: 0 flat, 1 by hosts
  int hierarchicalAllgather = -1;
};

class Communicator;

// A set across hosts whose hosts hold as many of its ranks each: its
// communicators within this rank's host and across hosts (the ranks of the same
// local index). Nulls for every other communicator.
struct HostSplit {
  Communicator* local = nullptr;
  Communicator* cross = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place; Average reduces as Sum (the caller scales).
  virtual void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) = 0;
  // Each span's input (src, or data itself) reduced into data, as if the spans were
  // one buffer laid end to end. The default copies in and packs; transports that
  // can, read the inputs and write the results directly.
  virtual void allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op);
  // allreduceSpans with every result multiplied by scale (floating dtypes:
  // Average's division, a postscale). The default scales the results after;
  // transports that can scale as they reduce, with no pass of its own.
  virtual void allreduceSpansScaled(const std::vector<Span>& spans, DataType dtype, ReduceOp op, double scale);
  // Bitwise OR of 64-bit words: the control plane's one small collective.
  virtual void allreduceBitsOr(uint64_t* words, size_t count) = 0;
  // The negotiation with a payload, where the transport offers one (else null).
  virtual NegotiationPayload* negotiationPayload() { return nullptr; }
  // out holds the pieces of every rank back to back; bytes[r] is rank r's piece.
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // sendBytes[r] go to rank r (in rank order in `in`); recvBytes[r] come from rank r.
  // largestPiece: the most bytes any rank sends any other, the same on every rank.
  virtual void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                         const std::vector<size_t>& recvBytes, size_t largestPiece) = 0;
  // Reduces buf (counts[r] elements for each rank r, back to back) and leaves
  // rank r's reduced piece in out. buf may be clobbered.
  virtual void reducescatter(void* buf, void* out, const std::vector<size_t>& counts,
                             DataType dtype, ReduceOp op) = 0;
  // reducescatter with the results multiplied by scale, as allreduceSpansScaled.
  virtual void reducescatterScaled(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                   ReduceOp op, double scale);
  virtual void barrier() = 0;
  // After a failure that ends this communicator's use: peers waiting on this
  // rank are made to fail now, not at their timeout (shared memory: the segment
  // is marked failed; TCP: the direct connections are shut).
  virtual void abort() {}
  virtual CommTraits traits() const { return {}; }
  virtual HostSplit hostSplit() { return {}; }
  // What autotune may change here, with the values in force; and a change.
  virtual CommTuning tuning() const { return {}; }
  virtual void setTuning(const CommTuning&) {}

 private:
  std::vector<char> packed_;  // allreduceSpans' default
};

struct CommOptions {
  std::string cpuOperations = "auto";
  bool shmDisable = false;
  bool shmSingleCopy = true;
  int64_t shmSlotBytes = 1 << 20;
  std::string shmPeerPath = "auto";
  int hierarchicalAllreduce = -1;
  int hierarchicalAllgather = -1;
  std::string jobId = "nojob";
  std::string bindAddress;
  std::string iface;
  double timeoutSeconds = 30;
  double connectTimeoutSeconds = 30;
  // The members' global ranks, by rank in the group, for messages ("rank 5", not
  // the group's "rank 1"); empty: the group's ranks are the global ones.
  std::vector<int> globalRanks;
};

// Builds the TCP (Gloo) communicator of one group. Every member calls it with the
// same storePrefix; rank/size are within the group.
class TransportDevice;
std::shared_ptr<TransportDevice> makeTransportDevice(const CommOptions& opts);
// With cpuOperations "mpi": MPI communicators over the group (flat) and across
// hosts (cross: among the ranks of the same local index when every host holds
// as many ranks, else among one leader per host, on leaders only), made
// beforehand by every rank.
struct MpiLinks {
  std::unique_ptr<Communicator> flat, cross;
};

// Checks the backends' settings in opts (CHORUS_SHM_PEER_PATH, CHORUS_SHM_SLOT_BYTES...);
// throws InvalidArgument naming the setting.
void checkCommOptions(const CommOptions& opts);

// A buffer of at least kSharedPoolMinBytes from the shared-memory backend's pool,
// which peers on this host write into directly and where a reused buffer costs
// no page faults or zero-filling; null when the pool cannot give one.
inline constexpr size_t kSharedPoolMinBytes = size_t{1} << 20;
std::shared_ptr<void> allocateFromSharedPool(size_t bytes);

// Positions of a group's members grouped by host, hosts in order of their first member.
std::vector<std::vector<int>> groupByHost(const std::vector<std::string>& memberHosts);
// Every host holds the same number of members.
bool evenHosts(const std::vector<std::vector<int>>& hostRanks);

// Picks the data path for a group from its members' host names and the
// settings: shared memory within a host (unless shmDisable), and between hosts
// TCP, or MPI when cpuOperations is "mpi".
std::unique_ptr<Communicator> makeCommunicator(const std::shared_ptr<TransportDevice>& device, Store& store,
                                               const std::string& storePrefix, int rank,
                                               const std::vector<std::string>& memberHosts,
                                               const CommOptions& opts, MpiLinks mpi = {});
std::unique_ptr<Communicator> makeTcpCommunicator(const std::shared_ptr<TransportDevice>& device,
                                                  Store& store, const std::string& storePrefix,
                                                  int rank, int size, const CommOptions& opts);

}  // namespace chorus
