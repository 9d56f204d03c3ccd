#pragma once
// This host's IPv4 addresses, and which of them reaches a given peer: what the
// launcher and an mpirun-started rank 0 bind the store to, and what every rank
// binds its TCP transport to when a job spans hosts.
#include <string>
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
// A TCP port free on every address of this host now (the kernel's pick), for a
// server another program starts later: torch.distributed's MASTER_PORT.
int freePort();

}  // namespace chorus::net
