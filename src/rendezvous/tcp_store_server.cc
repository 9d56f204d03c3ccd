#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <mutex>
#include <random>
#include <thread>

#include "chorus/error.h"
#include "chorus/store.h"
#include "core/byte_io.h"
#include "core/logging.h"
#include "rendezvous/kv_table.h"
#include "rendezvous/wire.h"

namespace chorus {

namespace {
using rendezvous::StoreOp;
using rendezvous::StoreStatus;

bool secretsEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // constant time in the length
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string peerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return std::string(host) + ":" + serv;
}

class Server : public TcpStoreServer {
 public:
  Server(const std::string& bindHost, int port, std::string secret) : secret_(std::move(secret)) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(bindHost.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) throw InvalidArgument("store: cannot resolve bind address '" + bindHost + "'");
    listenFd_ = ::socket(res->ai_family, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listenFd_, res->ai_addr, res->ai_addrlen) != 0 || ::listen(listenFd_, 128) != 0) {
      std::string why = std::strerror(errno);
      freeaddrinfo(res);
      ::close(listenFd_);
      throw Error("store: cannot listen on " + bindHost + ":" + std::to_string(port) + ": " + why);
    }
    freeaddrinfo(res);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(listenFd_, reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    acceptThread_ = std::thread([this] { acceptLoop(); });
  }

  ~Server() override {
    stop_ = true;
    acceptThread_.join();
    ::close(listenFd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clientFds_) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : clients_) t.join();
    for (int fd : clientFds_) ::close(fd);
  }

  int port() const override { return port_; }
  int64_t refusedCount() const override { return refused_.load(); }

 private:
  void acceptLoop() {
    while (!stop_) {
      pollfd p{listenFd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int fd = ::accept(listenFd_, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mu_);
      clientFds_.push_back(fd);
      clients_.emplace_back([this, fd] { serve(fd); });
    }
  }

  // One warning line per refused connection, at most one a second (a scan or a
  // stray job must not flood the launcher's stderr); the next line counts the rest.
  void logRefused(int fd, const std::string& why) {
    ++refused_;
    std::string text;
    {
      std::lock_guard<std::mutex> lock(logMu_);
      const auto now = std::chrono::steady_clock::now();
      if (now - lastLog_ < std::chrono::seconds(1)) {
        ++unlogged_;
        return;
      }
      lastLog_ = now;
      text = "chorus store: refused a connection from " + peerName(fd) + ": " + why;
      if (unlogged_) text += " (and " + std::to_string(unlogged_) + " more refused since the last line)";
      unlogged_ = 0;
    }
    logLine(LogLevel::kWarning, -1, text);
  }

  void serve(int fd) {
    std::vector<char> req;
    uint32_t announced = 0;
    while (!stop_) {
      const auto got = rendezvous::readFrame(fd, &req, &announced);
      if (got == rendezvous::FrameRead::kOversized) {
        logRefused(fd, "a frame of " + std::to_string(announced) + " bytes, over the store's limit");
        break;
      }
      if (got != rendezvous::FrameRead::kOk) break;
      ByteWriter out;
      bool keep = true;
      std::string key;
      bool parsed = false;
      try {
        ByteReader r(req);
        auto op = static_cast<StoreOp>(r.get<uint8_t>());
        std::string secret = r.getString();
        key = r.getString();
        parsed = true;
        if (!secretsEqual(secret, secret_)) {
          logRefused(fd, std::string(secret.empty() ? "no job secret" : "wrong job secret") + " (request for key '" +
                             key + "')");
          out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kRefused));
          keep = false;
        } else {
          handle(op, key, r, out);
        }
      } catch (const std::exception& e) {
        if (!parsed) {  // not a store request at all: nothing of it can be trusted
          logRefused(fd, std::string("a malformed request (") + e.what() + ")");
          break;
        }
        ByteWriter err;
        err.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kError));
        std::string msg = e.what();
        err.data().insert(err.data().end(), msg.begin(), msg.end());
        out = std::move(err);
      }
      if (!rendezvous::sendFrame(fd, out.data()) || !keep) break;
    }
    ::shutdown(fd, SHUT_RDWR);
  }

  void handle(StoreOp op, const std::string& key, ByteReader& r, ByteWriter& out) {
    switch (op) {
      case StoreOp::kSet:
        table_.set(key, r.getBytes());
        out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kOk));
        return;
      case StoreOp::kGet: {
        auto timeout = std::chrono::milliseconds(r.get<int64_t>());
        // Wait in slices so that the server can stop while a client waits.
        auto deadline = std::chrono::steady_clock::now() + timeout;
        std::optional<std::vector<char>> v;
        while (!stop_) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - std::chrono::steady_clock::now());
          v = table_.get(key, std::min(left, std::chrono::milliseconds(200)));
          if (v || left.count() <= 0) break;
        }
        if (!v) {
          out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kTimeout));
          return;
        }
        out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kOk));
        out.putBytes(*v);
        return;
      }
      case StoreOp::kAdd:
        out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kOk));
        out.put<int64_t>(table_.add(key, r.get<int64_t>()));
        return;
      case StoreOp::kCheck:
        out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kOk));
        out.put<uint8_t>(table_.check(key) ? 1 : 0);
        return;
    }
    throw Error("unknown store operation " + std::to_string(static_cast<int>(op)));
  }

  std::string secret_;
  int listenFd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> refused_{0};
  std::mutex logMu_;
  std::chrono::steady_clock::time_point lastLog_{};
  int64_t unlogged_ = 0;
  std::thread acceptThread_;
  std::mutex mu_;
  std::list<std::thread> clients_;
  std::vector<int> clientFds_;
  rendezvous::KvTable table_;
};
}  // namespace

std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& bindHost, int port,
                                                    const std::string& secret) {
  if (secret.empty()) throw InvalidArgument("store: a job secret is required");
  return std::make_unique<Server>(bindHost, port, secret);
}

std::string generateSecret() {
  unsigned char bytes[16];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

}  // namespace chorus
