#pragma once
// The Runtime: one per rank. Several may live in one process (ranks as threads).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/config.h"
#include "chorus/process_set.h"
#include "chorus/types.h"
#include "chorus/work.h"

namespace chorus {

// Called on the runtime's thread with the final shape of an output whose size is
// only known after negotiation; returns where to write it. Null: chorus allocates.
using Allocator = std::function<void*(const Shape& shape, DataType dtype)>;

// Memory for outputs that the other ranks on this host can write into: a
// shared-memory allreduce or allgather whose outputs all come from here moves
// its data straight between them (from kSharedMinBytes; smaller buffers, or when the
// system refuses, are private memory). Contents undefined; never null.
std::shared_ptr<void> allocateShared(size_t bytes);
inline constexpr size_t kSharedMinBytes = size_t{1} << 20;

struct OpOptions {
  std::string name;  // empty: an automatic name, the same on every rank in call order
  int32_t processSet = kGlobalProcessSetId;
  int32_t priority = 0;  // higher runs first among ops ready in the same cycle
  // CUDA tensors: the stream they are ready on (the framework's current stream,
  // as a cudaStream_t); null: the default stream. chorus's own stream waits for
  // it on the GPU; the host is not held.
  void* stream = nullptr;
};

struct AllreduceOptions : OpOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescaleFactor = 1.0;
  double postscaleFactor = 1.0;
};

struct ReducescatterOptions : OpOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescaleFactor = 1.0;
  double postscaleFactor = 1.0;
};

// Point-to-point: only the two ranks take part (no negotiation). Peers are
// global ranks, both in the process set; a recv takes the first send from its
// peer with the same set and tag, in posting order (MPI's matching).
struct SendRecvOptions {
  int32_t processSet = kGlobalProcessSetId;
  int32_t tag = 0;
  void* stream = nullptr;  // CUDA tensors: the stream they are ready on (see OpOptions::stream)
};

// One op of a batch (batchSendRecvAsync), as torch.distributed's P2POp.
struct P2pOp {
  bool send = true;
  Tensor tensor;  // read by a send; written by a recv (same bytes and dtype as the send)
  int peer = -1;
  int32_t tag = 0;
};

// Counters of one process set's controller on this rank (for tests and tuning).
// One kind of collective on one path of a process set: how many ran, how many
// tensors and bytes they carried, and the seconds this rank spent running them.
struct OpStat {
  std::string op;    // "allreduce", "allgather", ...
  std::string path;  // "SHM", "TCP", "MPI", "HIERARCHICAL", "INLINE" (with the negotiation), "NCCL", "STAGED"
  int64_t count = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

struct ProcessSetStats {
  int64_t cycles = 0;            // negotiation cycles run
  int64_t negotiatedOps = 0;     // ops decided by the coordinator
  int64_t cachedOps = 0;         // ops served from the response cache
  int64_t allreduceBatches = 0;  // allreduce collectives run (a fused batch counts once)
  int64_t allreduceTensors = 0;  // tensors they carried
  int64_t payloadOps = 0;        // small allreduces whose data went with the negotiation
  int64_t fusionThresholdBytes = 0;  // the settings in force (autotune changes them)
  double cycleTimeMs = 0;
  bool responseCache = false;
  int shmPeerPath = -1;            // 0 auto, 1 through caches, 2 through memory; -1: no shared memory
  int64_t shmSlotBytes = 0;        // bytes per pipelined round; 0: no shared memory
  int hierarchicalAllreduce = -1;  // 1 by hosts, 0 flat; -1: the set has no hierarchy
  int hierarchicalAllgather = -1;
  // CUDA tensors: "NCCL" or "STAGED" once the set has run an op on them, else "".
  std::string gpuPath;
  std::string gpuPathReason;  // why that path
  std::vector<OpStat> ops;    // by op and path, in that order
};

// One tensor's collective, as the op log records it: the op ("allreduce", ...),
// the tensor's bytes, the seconds from the start of the collective that carried
// it (fused with others, or in chunks) to its end, and the process set's size.
struct OpRecord {
  std::string op;
  int64_t bytes = 0;
  double seconds = 0;
  int setSize = 1;
  int32_t processSet = 0;
};

class RuntimeImpl;

// Whether this build has the MPI backend (jobs under mpirun, MPI communicators).
bool mpiBuilt();
// Whether chorus's CUDA backend was built and can be opened (no GPU needed).
bool cudaBuilt();
// NCCL's version (e.g. 22809) where it can be opened, else 0 (Horovod's nccl_built()).
int ncclBuilt();
// Folders to look for libnccl.so.2 in after CHORUS_NCCL_LIBRARY (frontends pass
// torch's nvidia/nccl/lib folders).
void setNcclSearchPath(std::vector<std::string> folders);

class Runtime {
 public:
  Runtime();
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Unset fields of config are taken from the environment.
  void init(Config config = {});
  void shutdown();
  bool isInitialized() const;

  int rank() const;
  int size() const;
  int localRank() const;
  int localSize() const;
  int crossRank() const;
  int crossSize() const;
  bool isHomogeneous() const;
  // Horovod's queries: the job joined an MPI world (mpirun, init(comm=...));
  // that MPI allows calls from any thread; chorus's own TCP controller
  // negotiates (Horovod's Gloo mode). False before init.
  bool mpiEnabled() const;
  bool mpiThreadsSupported() const;
  bool glooEnabled() const;
  // Where torch.distributed's env:// rendezvous meets in this job (MASTER_ADDR,
  // MASTER_PORT): the launcher's when it set them, else a port free on rank 0's
  // host that rank 0 chose at init (elastic jobs: every round anew), outside the
  // ephemeral range and held by rank 0 until shutdown: torch.distributed's
  // TCPStore (SO_REUSEADDR) can listen on it; bind(0) and other jobs' choosers cannot take it.
  std::pair<std::string, int> torchMaster() const;
  const Config& config() const;

  // Process sets. Add/remove are collective over all ranks, in the same order on each.
  ProcessSet globalProcessSet() const;
  ProcessSet processSet(int32_t id) const;
  std::vector<ProcessSet> processSets() const;
  ProcessSet addProcessSet(const std::vector<int>& ranks);
  void removeProcessSet(int32_t id);

  // Asynchronous collectives. Input buffers must stay valid until the Work is done.
  // output may equal input (in place). Shapes must match input.
  Work allreduceAsync(const Tensor& input, const Tensor& output, const AllreduceOptions& opts = {});
  Work groupedAllreduceAsync(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const AllreduceOptions& opts = {});
  Work allgatherAsync(const Tensor& input, const OpOptions& opts = {}, Allocator alloc = nullptr);
  Work groupedAllgatherAsync(const std::vector<Tensor>& inputs, const OpOptions& opts = {},
                             Allocator alloc = nullptr);
  // rootRank is a global rank, as in Horovod.
  Work broadcastAsync(const Tensor& input, const Tensor& output, int rootRank,
                      const OpOptions& opts = {});
  // splits: rows of the first dimension sent to each rank of the set (empty: even).
  Work alltoallAsync(const Tensor& input, const std::vector<int64_t>& splits,
                     const OpOptions& opts = {}, Allocator alloc = nullptr);
  Work reducescatterAsync(const Tensor& input, const ReducescatterOptions& opts = {},
                          Allocator alloc = nullptr);
  Work groupedReducescatterAsync(const std::vector<Tensor>& inputs,
                                 const ReducescatterOptions& opts = {}, Allocator alloc = nullptr);
  Work barrierAsync(int32_t processSet = kGlobalProcessSetId);
  Work joinAsync(int32_t processSet = kGlobalProcessSetId);

  // Blocking forms. Each runs its op's negotiation and execution on the calling
  // thread (no hand-off to the process set's background thread).
  void allreduce(const Tensor& input, const Tensor& output, const AllreduceOptions& opts = {});
  void broadcast(const Tensor& inout, int rootRank, const OpOptions& opts = {});
  Work allgather(const Tensor& input, const OpOptions& opts = {}, Allocator alloc = nullptr);
  Work alltoall(const Tensor& input, const std::vector<int64_t>& splits, const OpOptions& opts = {},
                Allocator alloc = nullptr);
  Work reducescatter(const Tensor& input, const ReducescatterOptions& opts = {},
                     Allocator alloc = nullptr);
  void barrier(int32_t processSet = kGlobalProcessSetId);
  int join(int32_t processSet = kGlobalProcessSetId);
  // The same for any op: submit() starts one op with an ...Async call (and does
  // nothing else that waits); it is waited for here, as by the blocking forms.
  // Rethrows the op's error.
  Work submitAndWait(const std::function<Work()>& submit);
  // submitAndWait that asks interrupted() as Work::waitUnless does; throws
  // Interrupted (holding the op, still in flight) when it says so.
  Work submitAndWaitUnless(const std::function<Work()>& submit, const std::function<bool()>& interrupted);

  // Point-to-point (SendRecvOptions above). The two ends must agree on bytes and
  // dtype, else both fail with Mismatch naming both ranks; a dead peer is a
  // PeerFailure and an unmatched op a Timeout (CHORUS_TIMEOUT_SECONDS), on each end.
  Work sendAsync(const Tensor& tensor, int dst, const SendRecvOptions& opts = {});
  Work recvAsync(const Tensor& tensor, int src, const SendRecvOptions& opts = {});
  // Posts every op at once, so that sends and receives in any order cannot
  // deadlock on each other (a pipeline's exchange between neighbours).
  std::vector<Work> batchSendRecvAsync(const std::vector<P2pOp>& ops, int32_t processSet = kGlobalProcessSetId,
                                       void* stream = nullptr);
  void send(const Tensor& tensor, int dst, const SendRecvOptions& opts = {});
  void recv(const Tensor& tensor, int src, const SendRecvOptions& opts = {});

  ProcessSetStats stats(int32_t processSet = kGlobalProcessSetId) const;

  // The op log: while on, every collective this rank runs on any process set is
  // recorded per tensor; takeOpLog() returns the records so far and clears them
  // (settle: first waits briefly for the records of collectives just completing).
  void setOpLog(bool on);
  std::vector<OpRecord> takeOpLog(bool settle = true);

  // Horovod's timeline (CHORUS_TIMELINE starts one at init): rank 0 writes a
  // Chrome trace of every tensor's negotiation and execution to path as the job
  // runs; stopTimeline() or shutdown() completes it. The other ranks ignore both calls.
  void startTimeline(const std::string& path, bool markCycles = false);
  void stopTimeline();

  // A fresh name, the same on every rank of the set when ranks call this in the
  // same order (for objects, such as a ZeRO engine, that name their ops).
  std::string uniqueName(int32_t processSet, const std::string& kind);

  // Marks a thread that waits for the set's ops by other means than Work (a
  // framework's executor, as TensorFlow's eager ops): the blocked-ranks check
  // (CHORUS_BLOCKED_FAIL_SECONDS) counts this rank as waiting until the returned
  // token is dropped. Throws for a set this rank is not in.
  std::shared_ptr<void> waitingElsewhere(int32_t processSet);

  // Waits for every asynchronous op this rank has in flight (all sets; a blocking
  // call waits for its own); rethrows the first error.
  void synchronize();

  // Elastic jobs: how often the driver changed the set of hosts since the round
  // this worker is in was formed, and whether those changes only removed hosts
  // ({0, false} outside an elastic job). Workers compare it at each commit, as
  // Horovod's check_host_updates() does.
  std::pair<int64_t, bool> elasticHostUpdates();
  // Between shutdown() and init() of an elastic worker: waits for the driver's
  // next round that includes this worker and returns its {rank, size} there, so
  // that the caller can choose process sets for that size; the next init() joins it.
  std::pair<int, int> elasticJoinNextRound();

 private:
  std::unique_ptr<RuntimeImpl> impl_;
};

}  // namespace chorus
