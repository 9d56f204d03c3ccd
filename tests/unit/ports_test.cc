// Ports chorus chooses for a server another program starts later
// (torch.distributed's MASTER_PORT): outside the kernel's ephemeral range, and
// held so that nothing but a server that shares it (SO_REUSEADDR) takes it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "base/net_address.h"

namespace chorus {
namespace {

// Read here, not through the code under test.
std::pair<int, int> kernelEphemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 32768, hi = 60999;
  in >> lo >> hi;
  return {lo, hi};
}

// Binds a TCP socket to port (0: the kernel's pick); reuse: SO_REUSEADDR;
// listen: then listens. Returns the fd, or -1 with errno.
int bindV4(int port, bool reuse, bool listen, const char* addr = "0.0.0.0") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, addr, &a.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && (!listen || ::listen(fd, 8) == 0)) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

// As torch's TCPStore binds: IPv6 dual-stack, SO_REUSEADDR (-1 when the host has no IPv6).
int bindV6DualReuseListen(int port, int* err) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return *err = errno, -1;
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 8) == 0) return fd;
  *err = errno;
  ::close(fd);
  return -1;
}

bool connects(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

TEST(PortChooser, NeverChoosesAPortInsideTheEphemeralRange) {
  const auto [lo, hi] = kernelEphemeralRange();
  EXPECT_EQ(net::ephemeralPortRange(), std::make_pair(lo, hi));
  // 300 held at once: all distinct (a held port is not offered twice), none in the range.
  std::vector<net::HeldPort> held;
  std::set<int> seen;
  for (int i = 0; i < 300; ++i) {
    held.push_back(net::holdFreePort());
    const int p = held.back().port();
    EXPECT_TRUE(held.back().held());
    EXPECT_GE(p, 10000);
    EXPECT_LE(p, 65535);
    EXPECT_TRUE(p < lo || p > hi) << "port " << p << " is inside the ephemeral range " << lo << "-" << hi;
    EXPECT_TRUE(seen.insert(p).second) << "port " << p << " was handed out twice while held";
  }
}

TEST(PortChooser, AHeldPortRefusesAPlainBindButAdmitsAServerThatSharesIt) {
  net::HeldPort held = net::holdFreePort();
  const int port = held.port();
  // Another job's probe, on any address: refused while held.
  for (const char* addr : {"0.0.0.0", "127.0.0.1"}) {
    EXPECT_EQ(bindV4(port, false, false, addr), -1) << "a plain bind to " << addr << ":" << port << " got it";
    EXPECT_EQ(errno, EADDRINUSE);
  }
  // torch's TCPStore (SO_REUSEADDR) binds and listens, over IPv4 ...
  const int server = bindV4(port, true, true);
  ASSERT_GE(server, 0) << "a server with SO_REUSEADDR could not listen on the held port: "
                       << std::strerror(errno);
  EXPECT_TRUE(connects(port));
  EXPECT_EQ(bindV4(port, false, false), -1) << "a plain bind got the port while the server listens";
  ::close(server);
  // ... and over IPv6 dual-stack, where the host has IPv6.
  int err = 0;
  const int v6 = bindV6DualReuseListen(port, &err);
  if (v6 >= 0) {
    EXPECT_TRUE(connects(port));
    ::close(v6);
  } else {
    EXPECT_TRUE(err == EAFNOSUPPORT || err == EADDRNOTAVAIL) << std::strerror(err);
  }
  // Still held after the server went; anyone's once released.
  EXPECT_EQ(bindV4(port, false, false), -1);
  held.release();
  const int after = bindV4(port, false, false);
  EXPECT_GE(after, 0) << std::strerror(errno);
  if (after >= 0) ::close(after);
}

// The race the holder closes: a program that keeps binding port 0 (as every
// process's servers and connections do) while ports are chosen, and the server
// that is to use each chosen port binds it a moment later.
TEST(PortChooser, ChosenPortsStayFreeForTheirServerWhileOthersBindPortZero) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    std::deque<int> open;  // ~800 kernel-picked ports taken at any time, rotating
    while (!stop) {
      const int fd = bindV4(0, false, false);
      if (fd >= 0) open.push_back(fd);
      if (open.size() > 800 || (fd < 0 && !open.empty())) {
        ::close(open.front());
        open.pop_front();
      }
    }
    for (int fd : open) ::close(fd);
  });
  int lost = 0;
  for (int round = 0; round < 300; ++round) {
    net::HeldPort held = net::holdFreePort();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the other program starting
    const int server = bindV4(held.port(), true, true);
    if (server < 0) {
      ++lost;
      ADD_FAILURE() << "round " << round << ": port " << held.port() << " was taken: " << std::strerror(errno);
    } else {
      ::close(server);
    }
  }
  stop = true;
  churn.join();
  EXPECT_EQ(lost, 0);
}

// With no MASTER_ADDR/MASTER_PORT from a launcher, rank 0 chooses torch's
// port at init and holds it until shutdown.
TEST(PortChooser, RankZeroHoldsTheTorchMasterPortUntilShutdown) {
  if (std::getenv("MASTER_ADDR") || std::getenv("MASTER_PORT")) GTEST_SKIP() << "MASTER_* set outside the test";
  auto store = makeMemoryStore();
  std::vector<std::pair<std::string, int>> masters(2);
  std::vector<int> plainBind(2, 0), sharedListen(2, -1);
  std::vector<std::thread> ranks;
  std::atomic<int> checked{0};
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Runtime rt;
      Config c;
      c.rank = r;
      c.size = 2;
      c.store = store;
      rt.init(c);
      masters[r] = rt.torchMaster();
      if (r == 0) {
        const int fd = bindV4(masters[r].second, false, false);
        plainBind[r] = fd < 0 ? errno : 0;
        if (fd >= 0) ::close(fd);
        const int server = bindV4(masters[r].second, true, true);
        sharedListen[r] = server < 0 ? errno : 0;
        if (server >= 0) ::close(server);
      }
      ++checked;
      while (checked < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rt.shutdown();
    });
  }
  for (auto& t : ranks) t.join();
  const auto [lo, hi] = kernelEphemeralRange();
  const int port = masters[0].second;
  EXPECT_EQ(masters[1], masters[0]);
  EXPECT_TRUE(port < lo || port > hi) << port;
  EXPECT_EQ(plainBind[0], EADDRINUSE) << "the chosen port was not held while the job ran";
  EXPECT_EQ(sharedListen[0], 0) << "torch's TCPStore could not listen: " << std::strerror(sharedListen[0]);
  const int after = bindV4(port, false, false);
  EXPECT_GE(after, 0) << "still held after shutdown: " << std::strerror(errno);
  if (after >= 0) ::close(after);
}

}  // namespace
}  // namespace chorus
