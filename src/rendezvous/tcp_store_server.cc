#include <arpa/inet.h>
#include <fcntl.h>
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
#include "base/byte_io.h"
#include "base/logging.h"
#include "rendezvous/kv_table.h"
#include "base/net_address.h"
#include "rendezvous/refusal_log.h"
#include "base/wire.h"

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

// A non-blocking socket listening on bindHost:port, or -1 with *why (and
// *inUse when another socket has the port). reuse: SO_REUSEADDR, for a port
// the caller names, so that a restart binds beside its predecessor's TIME_WAIT
// connections; without it the bind also fails beside a socket that merely
// holds the port (net::HeldPort), as a candidate of a derived port should.
int listenOn(const std::string& bindHost, int port, bool reuse, std::string* why, bool* inUse) {
  *inUse = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(bindHost.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
    throw InvalidArgument("store: cannot resolve bind address '" + bindHost + "'");
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  if (fd >= 0 && reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // SO_REUSEADDR once bound, even after a plain bind: the connections this server
  // accepts inherit it, so the TIME_WAIT they leave does not keep a restart out.
  const bool ok = fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 && ::listen(fd, 128) == 0;
  const int err = errno;
  freeaddrinfo(res);
  if (ok) return fd;
  if (fd >= 0) ::close(fd);
  *inUse = err == EADDRINUSE;
  *why = std::strerror(err);
  return -1;
}

// A connection that has not yet shown the job secret: it holds a socket and at
// most kMaxHello bytes, for at most the handshake time, and no thread.
struct Pending {
  int fd;
  std::string peer;
  std::chrono::steady_clock::time_point deadline;
  std::string buf;
};

// An authenticated connection, served by a thread of its own until it closes.
struct Client {
  int fd;
  std::thread thread;
  std::atomic<bool> done{false};
};

class Server : public TcpStoreServer {
 public:
  // listenFd: listening already (see listenOn).
  Server(int listenFd, std::string secret, const StoreServerOptions& o)
      : secret_(std::move(secret)), opts_(o),
        refusals_(std::chrono::milliseconds(static_cast<int64_t>(o.summarySeconds * 1000))), listenFd_(listenFd) {
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
    for (auto& p : pending_) ::close(p.fd);
    for (auto& c : clients_) ::shutdown(c->fd, SHUT_RDWR);
    for (auto& c : clients_) {
      c->thread.join();
      ::close(c->fd);
    }
    refusals_.flush(true);
  }

  int port() const override { return port_; }
  int64_t refusedCount() const override { return refusals_.count(); }
  int connectionCount() const override { return connections_.load(); }

 private:
  void acceptLoop() {
    std::vector<pollfd> fds;
    while (!stop_) {
      reap();
      fds.assign(1, pollfd{listenFd_, POLLIN, 0});
      for (const auto& p : pending_) fds.push_back(pollfd{p.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) continue;
      const auto now = std::chrono::steady_clock::now();
      // Pending handshakes first (fds[k + 1] is pending_[k]); then new connections.
      size_t k = 0;
      for (auto it = pending_.begin(); it != pending_.end(); ++k) {
        const bool ready = k + 1 < fds.size() && (fds[k + 1].revents & (POLLIN | POLLHUP | POLLERR));
        Handshake h = ready ? step(*it) : Handshake::kWaiting;
        if (h == Handshake::kWaiting && now >= it->deadline) {  // a trickle is cut too
          refusals_.refuse(it->peer, "no handshake within " + std::to_string(static_cast<int>(opts_.handshakeSeconds)) +
                                         " s");
          h = Handshake::kRefused;
        }
        if (h == Handshake::kWaiting) {
          ++it;
          continue;
        }
        if (h == Handshake::kAdmitted) startClient(it->fd);
        else ::close(it->fd);
        it = pending_.erase(it);
      }
      if (fds[0].revents & POLLIN) acceptAll(now);
      refusals_.flush();
    }
  }

  void acceptAll(std::chrono::steady_clock::time_point now) {
    while (true) {
      const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;  // EAGAIN: none left (or fds ran out: they come back as strangers leave)
      if (static_cast<int>(pending_.size()) >= opts_.maxPending) {
        // Full of strangers: the oldest goes, so that a rank arriving now still gets in.
        refusals_.refuse(pending_.front().peer, "too many connections without a handshake (" +
                                                    std::to_string(opts_.maxPending) + "); the oldest is closed");
        ::close(pending_.front().fd);
        pending_.pop_front();
      }
      pending_.push_back(Pending{fd, peerName(fd),
                                 now + std::chrono::milliseconds(static_cast<int64_t>(opts_.handshakeSeconds * 1000)),
                                 {}});
    }
  }

  enum class Handshake { kWaiting, kAdmitted, kRefused };

  // Reads what the connection sent: admitted once its hello carries the secret;
  // refused (and counted, before the client can see an answer) otherwise.
  Handshake step(Pending& p) {
    auto refuse = [&](const std::string& why) {
      refusals_.refuse(p.peer, why);
      return Handshake::kRefused;
    };
    char chunk[512];
    const size_t want = p.buf.size() < 4 ? 4 - p.buf.size() : 4 + announced(p) - p.buf.size();
    const ssize_t n = ::recv(p.fd, chunk, std::min(sizeof(chunk), want), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Handshake::kWaiting;
    if (n <= 0)
      return refuse(p.buf.empty() ? "closed without a handshake"
                                  : "a truncated handshake (" + std::to_string(p.buf.size()) + " bytes, then closed)");
    p.buf.append(chunk, static_cast<size_t>(n));
    if (p.buf.size() < 4) return Handshake::kWaiting;
    if (announced(p) > kMaxHello)
      return refuse("a frame of " + std::to_string(announced(p)) +
                    " bytes before authenticating (the handshake is at most " + std::to_string(kMaxHello) + ")");
    if (p.buf.size() < 4 + announced(p)) return Handshake::kWaiting;
    std::string secret;
    try {
      const std::vector<char> hello(p.buf.begin() + 4, p.buf.end());
      ByteReader r(hello);
      if (static_cast<StoreOp>(r.get<uint8_t>()) != StoreOp::kHello) throw Error("not a store handshake");
      secret = r.getString();
    } catch (const std::exception& e) {
      return refuse(std::string("a malformed handshake (") + e.what() + ")");
    }
    const bool ok = secretsEqual(secret, secret_);
    if (!ok) refuse(secret.empty() ? "no job secret" : "wrong job secret");
    ByteWriter out;
    out.put<uint8_t>(static_cast<uint8_t>(ok ? StoreStatus::kOk : StoreStatus::kRefused));
    rendezvous::sendFrame(p.fd, out.data());  // small: fits the socket's buffer without blocking
    return ok ? Handshake::kAdmitted : Handshake::kRefused;
  }

  static size_t announced(const Pending& p) {
    uint32_t n = 0;
    std::memcpy(&n, p.buf.data(), 4);
    return n;
  }

  void startClient(int fd) {
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Client>();
    c->fd = fd;
    Client* raw = c.get();
    ++connections_;
    c->thread = std::thread([this, raw] {
      serve(raw->fd);
      --connections_;
      raw->done = true;
    });
    clients_.push_back(std::move(c));
  }

  // Joins the threads of closed connections and closes their sockets.
  void reap() {
    for (auto it = clients_.begin(); it != clients_.end();) {
      if ((*it)->done) {
        (*it)->thread.join();
        ::close((*it)->fd);
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(int fd) {
    std::vector<char> req;
    uint32_t announcedBytes = 0;
    while (!stop_) {
      const auto got = rendezvous::readFrame(fd, &req, &announcedBytes);
      if (got == rendezvous::FrameRead::kOversized) {
        refusals_.refuse(peerName(fd), "a frame of " + std::to_string(announcedBytes) + " bytes, over the store's limit");
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
          refusals_.refuse(peerName(fd), std::string(secret.empty() ? "no job secret" : "wrong job secret") +
                                             " (request for key '" + key + "')");
          out.put<uint8_t>(static_cast<uint8_t>(StoreStatus::kRefused));
          keep = false;
        } else {
          handle(op, key, r, out);
        }
      } catch (const std::exception& e) {
        if (!parsed) {
          refusals_.refuse(peerName(fd), std::string("a malformed request (") + e.what() + ")");
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
      case StoreOp::kHello:  // only a connection's first frame, handled before any request
        break;
    }
    throw Error("unexpected store operation " + std::to_string(static_cast<int>(op)));
  }

  static constexpr size_t kMaxHello = 4096;
  std::string secret_;
  StoreServerOptions opts_;
  rendezvous::RefusalLog refusals_;
  int listenFd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread acceptThread_;
  std::list<Pending> pending_;                  // the accept thread's own
  std::list<std::unique_ptr<Client>> clients_;  // the accept thread's own (and the destructor's)
  rendezvous::KvTable table_;
};
}  // namespace

namespace {
void checkOptions(const std::string& secret, const StoreServerOptions& options) {
  if (secret.empty()) throw InvalidArgument("store: a job secret is required");
  if (options.maxPending < 1 || options.handshakeSeconds <= 0 || options.summarySeconds <= 0)
    throw InvalidArgument("store: maxPending must be >= 1 and the handshake and summary times > 0");
}
}  // namespace

std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& bindHost, int port, const std::string& secret,
                                                    const StoreServerOptions& options) {
  checkOptions(secret, options);
  std::string why;
  bool inUse = false;
  const int fd = listenOn(bindHost, port, true, &why, &inUse);
  if (fd < 0) throw Error("store: cannot listen on " + bindHost + ":" + std::to_string(port) + ": " + why);
  return std::make_unique<Server>(fd, secret, options);
}

std::unique_ptr<TcpStoreServer> startTcpStoreServerOnFirstFree(const std::string& bindHost,
                                                               const std::vector<int>& ports,
                                                               const std::string& secret,
                                                               const StoreServerOptions& options) {
  checkOptions(secret, options);
  if (ports.empty()) throw InvalidArgument("store: no candidate port to listen on");
  std::string tried;
  for (int port : ports) {
    std::string why;
    bool inUse = false;
    // A plain bind first, so that another job's held port reads as taken; a port
    // left only in TIME_WAIT (this job's store before a re-init) is bound again.
    int fd = listenOn(bindHost, port, false, &why, &inUse);
    if (fd < 0 && inUse && net::onlyTimeWaitOn(port)) fd = listenOn(bindHost, port, true, &why, &inUse);
    if (fd >= 0) {
      if (!tried.empty()) CHORUS_INFO(0, "chorus store: " << tried << " taken; listening on " << port);
      return std::make_unique<Server>(fd, secret, options);
    }
    if (!inUse) throw Error("store: cannot listen on " + bindHost + ":" + std::to_string(port) + ": " + why);
    tried += (tried.empty() ? "port " : ", ") + std::to_string(port);
  }
  throw Error("store: cannot listen on " + bindHost + ": every candidate port is in use (" + tried + ")");
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
