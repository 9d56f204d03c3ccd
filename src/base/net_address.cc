#include "base/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "chorus/error.h"

namespace chorus::net {

namespace {
std::string text(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

std::vector<in_addr> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) throw InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  std::vector<in_addr> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) out.push_back(reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr);
  freeaddrinfo(res);
  return out;
}
}  // namespace

std::vector<InterfaceAddress> localAddresses() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    out.push_back({i->ifa_name, text(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr),
                   (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return out;
}

std::string addressOfInterface(const std::string& name) {
  std::string known;
  for (const auto& a : localAddresses()) {
    if (a.iface == name) return a.address;
    known += (known.empty() ? "" : ", ") + a.iface + " (" + a.address + ")";
  }
  throw InvalidArgument("network interface '" + name + "' has no IPv4 address here; interfaces that are up: " +
                        (known.empty() ? "none" : known));
}

std::string addressInPrefix(const std::string& cidr) {
  const size_t slash = cidr.find('/');
  in_addr net{};
  int bits = -1;
  try {
    if (slash != std::string::npos) bits = std::stoi(cidr.substr(slash + 1));
  } catch (const std::exception&) {
  }
  if (slash == std::string::npos || bits < 0 || bits > 32 || inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &net) != 1)
    throw InvalidArgument("network prefix '" + cidr + "' is not of the form A.B.C.D/N");
  const uint32_t mask = bits == 0 ? 0 : htonl(~uint32_t{0} << (32 - bits));
  std::string known;
  for (const auto& a : localAddresses()) {
    in_addr x{};
    inet_pton(AF_INET, a.address.c_str(), &x);
    if ((x.s_addr & mask) == (net.s_addr & mask)) return a.address;
    known += (known.empty() ? "" : ", ") + a.address;
  }
  throw InvalidArgument("no address of this host is inside " + cidr + " (its addresses: " +
                        (known.empty() ? "none" : known) + ")");
}

std::string sourceAddressTo(const std::string& host) {
  const std::vector<in_addr> to = resolve(host);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(9);
  peer.sin_addr = to.front();
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  if (!ok) throw InvalidArgument("no route from this host to '" + host + "' (" + text(to.front()) + "): " + why);
  return text(me.sin_addr);
}

bool isThisHost(const std::string& host) {
  if (host == "localhost" || host == "localhost.localdomain") return true;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  const std::string me = name;
  if (host == me || me.rfind(host + ".", 0) == 0 || host.rfind(me + ".", 0) == 0) return true;
  std::vector<in_addr> addrs;
  try {
    addrs = resolve(host);
  } catch (const InvalidArgument&) {
    return false;
  }
  const auto mine = localAddresses();
  for (const in_addr& a : addrs) {
    if ((ntohl(a.s_addr) >> 24) == 127) return true;
    for (const auto& m : mine)
      if (m.address == text(a)) return true;
  }
  return false;
}

std::pair<int, int> ephemeralPortRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && 0 < lo && lo <= hi && hi <= 65535) return {lo, hi};
  return {32768, 60999};
}

HeldPort& HeldPort::operator=(HeldPort&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    port_ = o.port_;
    o.fd_ = -1;
  }
  return *this;
}

void HeldPort::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {
// A socket bound to port (0: the kernel's pick) on every address, v6 and v4
// when the host has IPv6, without SO_REUSEADDR: it fails while anyone at all
// holds the port. Returns the fd, or -1 with errno set.
int bindPlain(int port, bool* v6) {
  if (*v6) {
    const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      const int zero = 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
      const int err = errno;
      ::close(fd);
      if (err != EADDRNOTAVAIL && err != EAFNOSUPPORT) {
        errno = err;
        return -1;
      }
    }
    *v6 = false;  // no IPv6 here: IPv4 alone from now on
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

int boundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

// Bound plainly (the probe), the socket takes SO_REUSEADDR only now: the port
// never passes through a moment where it is free, and from now on a server
// with SO_REUSEADDR can bind and listen beside it.
HeldPort hold(int fd) {
  const int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw Error("cannot hold a TCP port (SO_REUSEADDR): " + why);
  }
  return HeldPort(fd, boundPort(fd));
}
}  // namespace

namespace {
// "1,2-5,..." from /proc/sys/net/ipv4/ip_local_reserved_ports: ports the admin keeps for services.
bool reservedPort(int port) {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_reserved_ports");
  std::string item;
  while (std::getline(in, item, ',')) {
    int a = 0, b = 0;
    const int n = std::sscanf(item.c_str(), "%d-%d", &a, &b);
    if ((n == 1 && port == a) || (n == 2 && port >= a && port <= b)) return true;
  }
  return false;
}
}  // namespace

bool onlyTimeWaitOn(int port) {
  // /proc/net/tcp{,6}: "sl local_address(hex ip:hex port) rem_address st ..."; st 06 is TIME_WAIT.
  // A socket that is only bound (a held port) is listed nowhere: it reads as taken.
  bool any = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      char local[64] = {0}, remote[64] = {0};
      unsigned state = 0;
      if (std::sscanf(line.c_str(), "%*d: %63s %63s %x", local, remote, &state) != 3) continue;
      const char* colon = std::strrchr(local, ':');
      if (!colon || std::strtol(colon + 1, nullptr, 16) != port) continue;
      if (state != 0x06) return false;
      any = true;
    }
  }
  return any;
}

HeldPort holdFreePort() {
  const auto [lo, hi] = ephemeralPortRange();
  // From 10000: below it sit the well-known and registered ports of services a host may start later.
  constexpr int kFirst = 10000, kLast = 65535;
  const int below = std::max(0, std::min(lo, kLast + 1) - kFirst);  // kFirst .. lo-1
  const int above = std::max(0, kLast - std::max(hi, kFirst - 1));  // hi+1 .. kLast
  bool v6 = true;
  std::string why = "the ephemeral range " + std::to_string(lo) + "-" + std::to_string(hi) +
                    " leaves no port outside it";
  if (below + above > 0) {
    std::random_device seed;
    std::mt19937 gen(seed());
    std::uniform_int_distribution<int> pick(0, below + above - 1);
    for (int tries = 0; tries < 256; ++tries) {
      const int i = pick(gen);
      const int port = i < below ? kFirst + i : hi + 1 + (i - below);
      if (reservedPort(port)) continue;
      const int fd = bindPlain(port, &v6);
      if (fd >= 0) return hold(fd);
      if (errno != EADDRINUSE && errno != EACCES) throw Error(std::string("cannot probe TCP port ") +
                                                             std::to_string(port) + ": " + std::strerror(errno));
      why = "256 random ports outside the ephemeral range " + std::to_string(lo) + "-" + std::to_string(hi) +
            " were all taken";
    }
  }
  // No port outside the range: the kernel's pick, held (a weaker guard: bind(0) with
  // SO_REUSEADDR elsewhere may share a port no one listens on yet).
  const int fd = bindPlain(0, &v6);
  if (fd < 0) throw Error("cannot find a free TCP port (" + why + "): " + std::strerror(errno));
  return hold(fd);
}

}  // namespace chorus::net
