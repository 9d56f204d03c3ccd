#pragma once
// A full mesh of TCP connections between the ranks of a group, driven by the
// calling thread, for small messages. Gloo's transport hands every message to its
// event-loop thread after a ready-to-receive handshake: three thread hand-offs
// per message, 0.3-0.4 ms per small allreduce on loopback, and 2-3 ms when a
// rank is bound to one core (the loop thread spins on epoll while the caller
// holds the pair's lock, until the scheduler preempts it). Here the caller
// writes and reads the sockets itself: one message latency per exchange.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus {

class Store;

class DirectMesh {
 public:
  // Every member calls it with the same prefix; host is the address to listen
  // on (an interface's name is resolved to its address).
  // names: each member's global rank, for messages (empty: the group's ranks).
  DirectMesh(Store& store, const std::string& prefix, int rank, int size, const std::string& host,
             const std::string& iface, std::chrono::milliseconds connectTimeout, std::chrono::milliseconds timeout,
             std::vector<int> names = {});
  ~DirectMesh();
  // Shuts every connection: peers blocked on this rank see it closed at once.
  void abort();
  DirectMesh(const DirectMesh&) = delete;
  DirectMesh& operator=(const DirectMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(fds_.size()); }

  struct Transfer {
    int peer;
    char* data;
    size_t bytes;
  };
  // Sends and receives one message per transfer, all at once (at most one of
  // each per peer). Every rank's calls must pair up with its peers' in order and
  // size; a message of another size is reported as a mismatch. Throws
  // PeerFailure when a peer closed its connection, Timeout after the timeout;
  // after either the mesh refuses further use.
  void run(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs);

 private:
  [[noreturn]] void fail(const std::string& why, bool timeout);
  std::string who(int r) const { return "rank " + std::to_string(names_.empty() ? r : names_.at(r)); }

  int rank_;
  std::vector<int> fds_;  // by peer rank; -1 for this rank
  std::chrono::milliseconds timeout_;
  uint32_t seq_ = 0;
  std::string broken_;
  std::vector<int> names_;
};

}  // namespace chorus
