#include <unistd.h>

#include <mutex>

#include "chorus/error.h"
#include "chorus/store.h"
#include "core/byte_io.h"
#include "rendezvous/wire.h"

namespace chorus {

namespace {
using rendezvous::StoreOp;
using rendezvous::StoreStatus;

class TcpStore : public Store {
 public:
  TcpStore(std::string host, int port, std::string secret, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), secret_(std::move(secret)) {
    fd_ = rendezvous::connectWithRetry(host_, port_, timeout);
    // The handshake: the secret first, before the store reads anything else.
    ByteWriter w;
    w.put<uint8_t>(static_cast<uint8_t>(StoreOp::kHello));
    w.putString(secret_);
    std::vector<char> reply;
    if (!rendezvous::sendFrame(fd_, w.data()) || !rendezvous::recvFrame(fd_, &reply) || reply.empty()) {
      ::close(fd_);
      throw PeerFailure("the rendezvous store at " + where() + " closed the connection during the handshake");
    }
    if (static_cast<StoreStatus>(reply[0]) != StoreStatus::kOk) {
      ::close(fd_);
      throw InvalidArgument("the rendezvous store at " + where() +
                            " refused the request: missing or wrong job secret (CHORUS_SECRET)");
    }
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

  std::string host_;
  int port_;
  std::string secret_;
  std::mutex mu_;
  int fd_ = -1;
};
}  // namespace

std::shared_ptr<Store> connectTcpStore(const std::string& host, int port, const std::string& secret,
                                       std::chrono::milliseconds connectTimeout) {
  return std::make_shared<TcpStore>(host, port, secret, connectTimeout);
}

}  // namespace chorus
