#include "comm/tcp_listen.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "chorus/error.h"

namespace chorus {

namespace {

std::string numericHost(const sockaddr* sa, socklen_t len) {
  char buf[NI_MAXHOST];
  if (getnameinfo(sa, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

}  // namespace

std::string tcpInterfaceAddress(const std::string& iface) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error("cannot list network interfaces: " + std::string(std::strerror(errno)));
  std::string v4, v6;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || iface != a->ifa_name) continue;
    if (a->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = numericHost(a->ifa_addr, sizeof(sockaddr_in));
    if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = numericHost(a->ifa_addr, sizeof(sockaddr_in6));
  }
  freeifaddrs(list);
  if (v4.empty() && v6.empty()) throw InvalidArgument("network interface '" + iface + "' has no IP address");
  return v4.empty() ? v6 : v4;
}

int tcpListen(const std::string& bindHost, const std::string& iface, int backlog, std::string* addr, int* port) {
  const std::string host = iface.empty() ? bindHost : tcpInterfaceAddress(iface);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0)
    throw InvalidArgument("cannot resolve the TCP transport's address '" + host + "': " + gai_strerror(rc));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    throw Error("cannot listen for TCP peers on " + host + ": " + why);
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  *addr = numericHost(reinterpret_cast<sockaddr*>(&ss), len);
  if (*addr == "0.0.0.0" || *addr == "::") {  // listening everywhere: peers use the host name
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    *addr = name;
  }
  return fd;
}

bool tcpReady(int fd, short events, int timeoutMs) {
  pollfd p{fd, events, 0};
  int rc;
  do rc = ::poll(&p, 1, timeoutMs); while (rc < 0 && errno == EINTR);
  return rc > 0;
}

int msLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count() + 1));
}

}  // namespace chorus
