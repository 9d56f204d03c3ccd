#include "rendezvous/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

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

int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  if (!ok) throw Error("cannot find a free TCP port: " + why);
  return ntohs(a.sin_port);
}

}  // namespace chorus::net
