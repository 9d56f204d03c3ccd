#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>

#include "chorus/error.h"
#include "chorus/store.h"
#include "base/byte_io.h"
#include "base/wire.h"

namespace chorus {

namespace {
using rendezvous::StoreOp;
using rendezvous::StoreStatus;

// A candidate port is given a moment to connect and to answer the hello: a
// stranger there costs each round this much, this job's store answers at once.
constexpr std::chrono::milliseconds kCandidateConnect{300};
constexpr std::chrono::milliseconds kCandidateHandshake{2000};
constexpr std::chrono::milliseconds kMinHandshake{500};

class TcpStore : public Store {
 public:
  // fd: connected to host:port; the handshake must be answered within handshakeTimeout
  // (a stranger on the port that never answers is an error, not a hang).
  TcpStore(std::string host, int port, std::string secret, int fd, std::chrono::milliseconds handshakeTimeout)
      : host_(std::move(host)), port_(port), secret_(std::move(secret)), fd_(fd) {
    setTimeout(handshakeTimeout);
    // The handshake: the secret first, before the store reads anything else.
    ByteWriter w;
    w.put<uint8_t>(static_cast<uint8_t>(StoreOp::kHello));
    w.putString(secret_);
    std::vector<char> reply;
    errno = 0;
    if (!rendezvous::sendFrame(fd_, w.data()) || !rendezvous::recvFrame(fd_, &reply) || reply.empty()) {
      const bool slow = errno == EAGAIN || errno == EWOULDBLOCK;
      ::close(fd_);
      fd_ = -1;
      if (slow)
        throw Timeout("the rendezvous store at " + where() + " did not answer the handshake within " +
                      std::to_string(handshakeTimeout.count()) + " ms");
      throw PeerFailure("the rendezvous store at " + where() + " closed the connection during the handshake");
    }
    if (static_cast<StoreStatus>(reply[0]) != StoreStatus::kOk) {
      ::close(fd_);
      fd_ = -1;
      throw InvalidArgument("the rendezvous store at " + where() +
                            " refused the request: missing or wrong job secret (CHORUS_SECRET)");
    }
    setTimeout(std::chrono::milliseconds(0));  // requests wait as long as they say
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const std::vector<char>& value) override {
    ByteWriter w;
    header(w, StoreOp::kSet, key);
    w.putBytes(value);
    call(w, key);
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    ByteWriter w;
    header(w, StoreOp::kGet, key);
    w.put<int64_t>(timeout.count());
    auto reply = call(w, key, timeout);
    ByteReader r(reply);
    return r.getBytes();
  }
  int64_t add(const std::string& key, int64_t delta) override {
    ByteWriter w;
    header(w, StoreOp::kAdd, key);
    w.put<int64_t>(delta);
    auto reply = call(w, key);
    ByteReader r(reply);
    return r.get<int64_t>();
  }
  bool check(const std::string& key) override {
    ByteWriter w;
    header(w, StoreOp::kCheck, key);
    auto reply = call(w, key);
    ByteReader r(reply);
    return r.get<uint8_t>() != 0;
  }

 private:
  void header(ByteWriter& w, StoreOp op, const std::string& key) {
    w.put<uint8_t>(static_cast<uint8_t>(op));
    w.putString(secret_);
    w.putString(key);
  }

  // Returns the reply body after the status byte.
  std::vector<char> call(ByteWriter& w, const std::string& key,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char> reply;
    if (fd_ < 0 || !rendezvous::sendFrame(fd_, w.data()) || !rendezvous::recvFrame(fd_, &reply) ||
        reply.empty()) {
      throw PeerFailure("lost the connection to the rendezvous store at " + where());
    }
    auto status = static_cast<StoreStatus>(reply[0]);
    std::vector<char> body(reply.begin() + 1, reply.end());
    switch (status) {
      case StoreStatus::kOk:
        return body;
      case StoreStatus::kTimeout:
        throw Timeout("timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for store key '" + key + "' at " + where());
      case StoreStatus::kRefused:
        ::close(fd_);
        fd_ = -1;
        throw InvalidArgument("the rendezvous store at " + where() +
                              " refused the request: missing or wrong job secret (CHORUS_SECRET)");
      default:
        throw Error("the rendezvous store at " + where() + " failed: " +
                    std::string(body.begin(), body.end()));
    }
  }
  std::string where() const { return host_ + ":" + std::to_string(port_); }
  void setTimeout(std::chrono::milliseconds t) {
    timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>(t.count() % 1000 * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }

  std::string host_;
  int port_;
  std::string secret_;
  std::mutex mu_;
  int fd_ = -1;
};
}  // namespace

std::shared_ptr<Store> connectTcpStore(const std::string& host, int port, const std::string& secret,
                                       std::chrono::milliseconds connectTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = rendezvous::connectWithRetry(host, port, connectTimeout);
  const auto left = connectTimeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - start);
  return std::make_shared<TcpStore>(host, port, secret, fd, std::max(left, kMinHandshake));
}

std::shared_ptr<Store> connectTcpStoreOnFirstOf(const std::string& host, const std::vector<int>& ports,
                                                const std::string& secret, std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  using std::chrono::steady_clock;
  if (ports.empty()) throw InvalidArgument("store: no candidate port to connect to");
  if (ports.size() == 1) return connectTcpStore(host, ports[0], secret, timeout);
  const auto deadline = steady_clock::now() + timeout;
  std::vector<std::string> last(ports.size(), "no attempt made");
  // Round after round over the candidates, in order: rank 0 may not listen yet.
  do {
    for (size_t i = 0; i < ports.size(); ++i) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
      try {
        const milliseconds connect = std::clamp(left, milliseconds(1), kCandidateConnect);
        const int fd = rendezvous::connectWithRetry(host, ports[i], connect);
        const milliseconds handshake = std::max(std::min(left, kCandidateHandshake), kMinHandshake);
        return std::make_shared<TcpStore>(host, ports[i], secret, fd, handshake);
      } catch (const Error& e) {  // not this job's store (yet): the next candidate
        last[i] = e.what();
      }
    }
    std::this_thread::sleep_for(milliseconds(50));
  } while (steady_clock::now() < deadline);
  std::string why;
  for (size_t i = 0; i < ports.size(); ++i) why += "\n  port " + std::to_string(ports[i]) + ": " + last[i];
  throw Timeout("no rendezvous store with this job's secret answered at " + host + " on any of its " +
                std::to_string(ports.size()) + " candidate ports within " + std::to_string(timeout.count()) +
                " ms; the last attempt at each:" + why);
}

}  // namespace chorus
