#pragma once
// Collectives on device buffers, one path per process set, chosen when the set
// first runs an op on device tensors: NCCL when every rank has a GPU of its own,
// else staged through pinned host memory into the set's CPU communicator.
// Each call queues its work on `stream` (the staged path runs its host part
// before returning); results are ready for work queued on stream after it.
// Every rank of the set makes the same calls in the same order; failures throw
// PeerFailure / Timeout within the configured timeout.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "chorus/types.h"
#include "comm/communicator.h"
#include "device/device_backend.h"

namespace chorus {

class DevicePath {
 public:
  virtual ~DevicePath() = default;
  // What the timeline and stats() call it: "NCCL" or "STAGED".
  virtual const char* transport() const = 0;
  // buf = reduce(in) over the set, times scale (floating dtypes; 1: none).
  // in may equal buf. Average reduces as Sum (the caller's scale divides).
  virtual void allreduce(void* buf, const void* in, size_t count, DataType dtype, ReduceOp op, double scale,
                         void* stream) = 0;
  // A rank that joined takes part in an allreduce with zeros of this size.
  virtual void allreduceJoined(size_t count, DataType dtype, ReduceOp op, double scale, void* stream) = 0;
  // out holds every rank's piece back to back; bytes[r] is rank r's.
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes, void* stream) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root, void* stream) = 0;
  virtual void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                         const std::vector<size_t>& recvBytes, void* stream) = 0;
  // in holds counts[r] elements for each rank r back to back; out gets mine, reduced and scaled.
  virtual void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                             ReduceOp op, double scale, void* stream) = 0;
  // Ends the path's use after a failure, so that peers fail now (NCCL: ncclCommAbort).
  virtual void abort() {}
};

struct DevicePathOptions {
  // "auto" (NCCL where every rank has its own GPU and NCCL opens, else staged),
  // "nccl" (NCCL or an error), "host" (staged; Horovod's MPI/GLOO names too).
  std::string gpuOperations = "auto";
  int64_t stageChunkBytes = 4 << 20;  // staged allreduce: bytes per pipelined chunk
  double timeoutSeconds = 30;
};

// Chooses and builds the path of one set (collective over cpu: every member
// calls it with the same options). hostOf: this rank's host name. why: the
// reason for the choice, for the log and stats().
std::unique_ptr<DevicePath> makeDevicePath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                           Communicator& cpu, const std::string& hostOf,
                                           const DevicePathOptions& opts, std::string* why);

// Horovod's hierarchical allreduce for CUDA tensors: reduce-scattered within
// the host on `local`, each slice allreduced across hosts on `cross`, gathered
// back within the host; every other op on `flat`. localRank/localSize: this
// rank's place in the host's group.
std::unique_ptr<DevicePath> makeHierarchicalPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                                 std::unique_ptr<DevicePath> local, std::unique_ptr<DevicePath> cross,
                                                 std::unique_ptr<DevicePath> flat, int localRank, int localSize);

// The NCCL path over the given NCCL functions (ncclApi() for the real one;
// tests drive its watchdog over the host stand-in with functions of their own).
struct NcclApi;
std::unique_ptr<DevicePath> makeNcclPathWith(const NcclApi& api, const std::shared_ptr<DeviceBackend>& backend,
                                             int ordinal, Communicator& cpu, const DevicePathOptions& opts);

// The staged path alone (tests; the factory's fallback).
std::unique_ptr<DevicePath> makeStagedPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                           Communicator& cpu, const DevicePathOptions& opts);

}  // namespace chorus
