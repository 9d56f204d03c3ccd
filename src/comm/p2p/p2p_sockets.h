#pragma once
// The sockets of the point-to-point engine: abstract Unix sockets between ranks
// of one host, one bounded TCP connect to another host, a blocking write.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus::p2p {

// Non-blocking, and TCP_NODELAY where it applies.
void setNonBlocking(int fd);
// Listens on this rank's abstract Unix socket (per network namespace, so per
// host here; the job's token keeps jobs apart); -1 when the system refuses.
int listenLocal(uint64_t token, int rank);
// Connects to rank's; -1 when it is not there.
int connectLocal(uint64_t token, int rank);
// One attempt, bounded by timeout: the peer listened before it published its
// address, so a refusal means it is gone. -1 with the reason in *why.
int connectOnce(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why);
// All of data, waiting for room up to timeout each time; false when the peer is gone.
bool writeAll(int fd, const void* data, size_t bytes, std::chrono::milliseconds timeout);

}  // namespace chorus::p2p
