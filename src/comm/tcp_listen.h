#pragma once
// Listening sockets for chorus's own TCP links (the direct mesh, point-to-point).
#include <chrono>
#include <string>

namespace chorus {

// The address of a network interface (IPv4 first, else IPv6); throws InvalidArgument.
std::string tcpInterfaceAddress(const std::string& iface);
// Listens on host (or iface's address when iface is set), any port; returns the
// socket and the address and port that peers connect to.
int tcpListen(const std::string& host, const std::string& iface, int backlog, std::string* addr, int* port);
// poll() on one descriptor; true when it is ready for events.
bool tcpReady(int fd, short events, int timeoutMs);
// Milliseconds left until deadline, rounded up, at least 0.
int msLeft(std::chrono::steady_clock::time_point deadline);

}  // namespace chorus
