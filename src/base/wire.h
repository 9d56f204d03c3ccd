#pragma once
// Framed messages over a blocking TCP socket: [u32 length][payload].
#include <chrono>
#include <string>
#include <vector>

namespace chorus::rendezvous {

enum class StoreOp : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kHello = 5 };
enum class StoreStatus : uint8_t { kOk = 0, kTimeout = 1, kRefused = 2, kError = 3 };

// Both return false when the peer closed the connection.
bool sendFrame(int fd, const std::vector<char>& payload);
bool recvFrame(int fd, std::vector<char>* payload);
// recvFrame with the reason when there is no frame: the peer closed (or the
// socket failed) between frames, announced more than the frame limit, or
// stopped within a frame.
enum class FrameRead { kOk, kClosed, kOversized, kTruncated };
FrameRead readFrame(int fd, std::vector<char>* payload, uint32_t* announced);

// Connects to host:port (what: for the error), retrying until the deadline. Throws chorus::Timeout.
int connectWithRetry(const std::string& host, int port, std::chrono::milliseconds timeout,
                     const std::string& what = "the rendezvous store");

}  // namespace chorus::rendezvous
