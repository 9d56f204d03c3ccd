// chorus-link-bench: what raw TCP moves over a link, the yardstick for
// collectives across hosts. Both ends send and receive at once (an allreduce
// between two hosts uses the link in both directions), through 1 MiB writes.
//   on host A: chorus-link-bench serve PORT [BIND]
//   on host B: chorus-link-bench send HOST PORT SECONDS  -> per-direction GB/s
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kChunk = 1 << 20;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "chorus-link-bench: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Sends until `stop`, then shuts the sending side; receives until the peer
// does: bytes sent, bytes received, seconds of the receiving.
struct Result {
  double sent = 0, received = 0, seconds = 0;
};

Result duplex(int fd, double seconds) {
  Result res;
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    std::vector<char> buf(kChunk, 1);
    while (!stop.load()) {
      const ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      res.sent += static_cast<double>(n);
    }
    ::shutdown(fd, SHUT_WR);
  });
  std::vector<char> buf(kChunk);
  const auto start = Clock::now();
  // The client stops sending after `seconds`; the server (seconds 0) sends until
  // the client's stream ends.
  std::thread timer([&] {
    if (seconds <= 0) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
  });
  while (true) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    res.received += static_cast<double>(n);
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  timer.join();
  sender.join();
  return res;
}

int serve(int port, const char* bind) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, bind, &a.sin_addr);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, 1) != 0) die("listen");
  std::printf("listening\n");
  std::fflush(stdout);
  int fd = ::accept(ls, nullptr, nullptr);
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  duplex(fd, 0);  // until the client stops
  ::close(fd);
  return 0;
}

int send(const char* host, int port, double seconds) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &res) != 0) die("resolve");
  int fd = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    ::close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  freeaddrinfo(res);
  if (fd < 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const Result r = duplex(fd, seconds);
  std::printf("{\"sent_GBps\": %.4f, \"received_GBps\": %.4f, \"seconds\": %.3f}\n", r.sent / r.seconds / 1e9,
              r.received / r.seconds / 1e9, r.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "serve") return serve(std::atoi(argv[2]), argc > 3 ? argv[3] : "0.0.0.0");
  if (argc == 5 && std::string(argv[1]) == "send") return send(argv[2], std::atoi(argv[3]), std::atof(argv[4]));
  std::fprintf(stderr, "usage: chorus-link-bench serve PORT [BIND] | send HOST PORT SECONDS\n");
  return 2;
}
