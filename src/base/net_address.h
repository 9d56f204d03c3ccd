#pragma once
// This host's IPv4 addresses, and which of them reaches a given peer: what the
// launcher and an mpirun-started rank 0 bind the store to, and what every rank
// binds its TCP transport to when a job spans hosts.
#include <string>
#include <utility>
#include <vector>

namespace chorus::net {

struct InterfaceAddress {
  std::string iface;    // "eth0"
  std::string address;  // "10.1.2.3"
  bool loopback = false;
};

// The IPv4 addresses of the interfaces that are up.
std::vector<InterfaceAddress> localAddresses();
// The address of interface `name`; throws InvalidArgument naming the interfaces there are.
std::string addressOfInterface(const std::string& name);
// The local address inside "10.1.0.0/16"; throws when none is, or the prefix is malformed.
std::string addressInPrefix(const std::string& cidr);
// The local address the kernel routes from towards host (no packet is sent);
// throws InvalidArgument when host does not resolve.
std::string sourceAddressTo(const std::string& host);
// Whether host names this machine: localhost, its host name, or an address of its own.
bool isThisHost(const std::string& host);

// The ports the kernel picks itself (bind to port 0, outgoing connections):
// /proc/sys/net/ipv4/ip_local_port_range, else Linux's default 32768..60999.
std::pair<int, int> ephemeralPortRange();

// A TCP port chosen for a server that another program starts later
// (torch.distributed's MASTER_PORT), kept from everyone else until then.
// The port lies outside the ephemeral range, so that no bind to port 0 and no
// outgoing connection can take it; it was free for a plain bind (no
// SO_REUSEADDR) on every address, v4 and v6; and this object keeps a socket
// bound to it with SO_REUSEADDR, never listening. On Linux that socket lets a
// server that sets SO_REUSEADDR (torch's TCPStore does) bind and listen on the
// port, while a plain bind (another job's probe) fails with EADDRINUSE.
class HeldPort {
 public:
  HeldPort() = default;
  HeldPort(int fd, int port) : fd_(fd), port_(port) {}
  HeldPort(HeldPort&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  HeldPort& operator=(HeldPort&& o) noexcept;
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  ~HeldPort() { release(); }

  int port() const { return port_; }
  bool held() const { return fd_ >= 0; }
  void release();  // the port is anyone's again

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Chooses a port at random among 10000..65535 outside the ephemeral range and
// the reserved ports, and holds it (see HeldPort). When the range leaves no port outside it, the
// kernel's pick is held instead. Throws chorus::Error when no port is free.
HeldPort holdFreePort();

// Whether the only sockets on TCP port are in TIME_WAIT (a server that just
// closed): such a port can be bound again with SO_REUSEADDR.
bool onlyTimeWaitOn(int port);

}  // namespace chorus::net
