#include "base/wire.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "chorus/error.h"

namespace chorus::rendezvous {

namespace {
bool writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool readAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
constexpr uint32_t kMaxFrame = 256u << 20;

// A connect that gives up after at most 2 s (or at the deadline): a blocking
// one to an address that drops packets waits minutes. Leaves fd blocking.
bool connectWithin(int fd, const addrinfo* ai, std::chrono::steady_clock::time_point deadline) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  bool ok = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLOUT, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 100, 2000)));
    while (rc < 0 && errno == EINTR);
    int err = ETIMEDOUT;
    socklen_t len = sizeof(err);
    if (rc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    errno = err;
    ok = err == 0;
  }
  fcntl(fd, F_SETFL, flags);
  return ok;
}
}  // namespace

bool sendFrame(int fd, const std::vector<char>& payload) {
  uint32_t n = static_cast<uint32_t>(payload.size());
  return writeAll(fd, reinterpret_cast<const char*>(&n), 4) && writeAll(fd, payload.data(), n);
}

FrameRead readFrame(int fd, std::vector<char>* payload, uint32_t* announced) {
  uint32_t n = 0;
  if (!readAll(fd, reinterpret_cast<char*>(&n), 4)) return FrameRead::kClosed;
  *announced = n;
  if (n > kMaxFrame) return FrameRead::kOversized;
  payload->resize(n);
  return readAll(fd, payload->data(), n) ? FrameRead::kOk : FrameRead::kTruncated;
}

bool recvFrame(int fd, std::vector<char>* payload) {
  uint32_t n = 0;
  return readFrame(fd, payload, &n) == FrameRead::kOk;
}

int connectWithRetry(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string lastError = "no attempt made";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      lastError = gai_strerror(rc);
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (connectWithin(fd, ai, deadline)) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          freeaddrinfo(res);
          return fd;
        }
        lastError = std::strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(res);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw Timeout("could not connect to " + what + " at " + host + ":" +
                std::to_string(port) + " within " + std::to_string(timeout.count()) +
                " ms: " + lastError);
}

}  // namespace chorus::rendezvous
