#include "comm/p2p/p2p_sockets.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "comm/tcp_listen.h"

namespace chorus::p2p {

void setNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // (refused by Unix sockets: harmless)
}

namespace {

sockaddr_un localName(uint64_t token, int rank, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "chorus-p2p-" + std::to_string(token) + "-" + std::to_string(rank);
  std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof(a.sun_path) - 2));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

}  // namespace

int listenLocal(uint64_t token, int rank) {
  socklen_t len;
  const sockaddr_un a = localName(token, rank, &len);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(fd, 128) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int connectLocal(uint64_t token, int rank) {
  socklen_t len;
  const sockaddr_un a = localName(token, rank, &len);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int connectOnce(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *why = "cannot resolve " + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS) {
    int err = ETIMEDOUT;
    if (tcpReady(fd, POLLOUT, static_cast<int>(timeout.count()))) {
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    errno = err;
    rc = err == 0 ? 0 : -1;
  }
  if (rc != 0) {
    *why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool writeAll(int fd, const void* data, size_t bytes, std::chrono::milliseconds timeout) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t r = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN && tcpReady(fd, POLLOUT, static_cast<int>(timeout.count()))) continue;
    if (r <= 0) return false;
    p += r;
    bytes -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace chorus::p2p
