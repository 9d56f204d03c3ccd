#pragma once
// Point-to-point messages between two ranks, outside any negotiation: only the
// two ends take part. Matching is MPI's: a recv takes the first send from its
// peer with the same process set and tag, in the order they were posted.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/types.h"

namespace chorus {

class Store;

struct P2pRequest {
  bool send = true;
  void* data = nullptr;  // read by a send, written by a recv; valid until done is called
  size_t bytes = 0;
  DataType dtype = DataType::kUInt8;
  int peer = -1;  // global rank
  int32_t processSet = 0;
  int32_t tag = 0;
  // Called once, from any thread, with null or the op's error (Mismatch when the
  // two ends disagree on size or dtype, PeerFailure, Timeout, ShutdownError).
  std::function<void(std::exception_ptr)> done;
};

class PointToPoint {
 public:
  virtual ~PointToPoint() = default;
  // Posts the ops together: a batch that sends and receives in any order never
  // deadlocks on it. Errors found at once (an unreachable peer) go to done.
  virtual void post(std::vector<P2pRequest> ops) = 0;
  // Moves messages along on the calling thread until done() holds or a short
  // while passed (a waiting thread drives progress itself: no hand-off to the
  // background thread). False once shut down.
  virtual bool drive(const std::function<bool()>& done) = 0;
  // Fails whatever is in flight (ShutdownError) and closes every connection.
  virtual void shutdown() = 0;
};

// Moves the payloads of large messages between hosts when another library carries
// the job's data (MPI under CHORUS_CPU_OPERATIONS=mpi); the engine still matches,
// checks and reports, over its own connections.
class P2pBulk {
 public:
  virtual ~P2pBulk() = default;
  // Starts moving bytes to or from peer (a global rank); key names the message
  // between the pair (the sender's id). Returns a request.
  virtual uint64_t startSend(const void* data, size_t bytes, int peer, uint64_t key) = 0;
  virtual uint64_t startRecv(void* data, size_t bytes, int peer, uint64_t key) = 0;
  // True once the request is done (and forgotten). Throws PeerFailure on an error.
  virtual bool done(uint64_t request) = 0;
};

struct P2pOptions {
  std::string bindAddress;
  std::string iface;
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds connectTimeout{30000};
  bool crossMemoryAttach = true;  // same-host peers read large sends straight from the sender
  bool sharedMemoryRings = true;  // same-host pairs exchange frames through shared memory
  std::string jobId = "nojob";    // names the rings' segments (the launcher removes a job's leftovers)
};

// Every rank of the job makes one at init, with the same store prefix; hosts are
// the host names of every global rank (same-host peers may use cross-memory attach).
// bulk: when given, it carries large messages to peers on other hosts.
std::unique_ptr<PointToPoint> makePointToPoint(Store& store, const std::string& prefix, int rank,
                                               const std::vector<std::string>& hosts, const P2pOptions& opts,
                                               std::unique_ptr<P2pBulk> bulk = nullptr);

}  // namespace chorus
