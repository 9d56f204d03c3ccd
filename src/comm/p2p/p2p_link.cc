#include "comm/p2p/p2p_link.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace chorus::p2p {

namespace {
// Small frames (and eager payloads up to this) arrive in one read.
constexpr size_t kReadAhead = 128 << 10;

std::string closedWhy(ssize_t r) {
  return r < 0 ? std::string(std::strerror(errno)) : std::string("connection closed");
}
}  // namespace

Link::~Link() { close(); }

void Link::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  out_.clear();
}

void Link::queue(const Frame& f, const void* payload, size_t bytes, bool copy) {
  out_.push_back(Out{f, static_cast<const char*>(payload), bytes, copy, {}, 0});
}

void Link::queueCopy(const Frame& f, const std::string& payload) {
  out_.push_back(Out{f, nullptr, payload.size(), true, std::vector<char>(payload.begin(), payload.end()), 0});
  out_.back().payload = out_.back().owned.data();
}

bool Link::flush(std::string* why) {
  while (!out_.empty() && fd_ >= 0) {
    Out& o = out_.front();
    const size_t total = sizeof(Frame) + o.bytes;
    iovec iov[2];
    int n = 0;
    if (o.done < sizeof(Frame)) iov[n++] = {reinterpret_cast<char*>(&o.f) + o.done, sizeof(Frame) - o.done};
    const size_t sent = o.done > sizeof(Frame) ? o.done - sizeof(Frame) : 0;
    if (o.bytes > sent) iov[n++] = {const_cast<char*>(o.payload) + sent, o.bytes - sent};
    const ssize_t r = writeSome(iov, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (r <= 0) {
      *why = closedWhy(r);
      return false;
    }
    o.done += static_cast<size_t>(r);
    if (o.done == total) out_.pop_front();
  }
  for (Out& o : out_) {
    if (!o.copy || !o.owned.empty() || o.bytes == 0) continue;
    o.owned.assign(o.payload, o.payload + o.bytes);  // the whole payload: offsets stay as they are
    o.payload = o.owned.data();
  }
  return true;
}

bool Link::pump(Sink& sink, std::string* why) {
  if (buf_.empty()) buf_.resize(kReadAhead);
  if (rings_ && !drainDoorbells(why)) return false;
  while (fd_ >= 0) {
    // Whatever is buffered first: headers, and payload bytes read along with them.
    while (true) {
      if (!inPayload_) {
        if (!takeHeader()) break;
        left_ = payloadBytes(in_);
        dst_ = left_ ? sink.onHeader(*this, in_) : nullptr;
        if (fd_ < 0) return true;  // the sink closed this link
        if (left_ == 0) {
          sink.onFrame(*this, in_);
          continue;
        }
        inPayload_ = true;
      }
      const size_t have = std::min<uint64_t>(left_, bufEnd_ - bufStart_);
      if (have == 0) break;
      if (dst_) {
        std::memcpy(dst_, buf_.data() + bufStart_, have);
        dst_ += have;
      }
      bufStart_ += have;
      left_ -= have;
      if (left_ == 0) {
        inPayload_ = false;
        dst_ = nullptr;
        sink.onFrame(*this, in_);
      }
    }
    if (bufStart_ == bufEnd_) bufStart_ = bufEnd_ = 0;
    // A large payload goes straight to its place; anything else through the buffer.
    const bool direct = inPayload_ && dst_ && left_ >= buf_.size() / 2;
    if (!direct && bufStart_ > 0 && bufEnd_ == buf_.size()) {
      std::memmove(buf_.data(), buf_.data() + bufStart_, bufEnd_ - bufStart_);
      bufEnd_ -= bufStart_;
      bufStart_ = 0;
    }
    char* to = direct ? dst_ : buf_.data() + bufEnd_;
    const size_t want = direct ? left_ : buf_.size() - bufEnd_;
    const ssize_t r = readSome(to, want);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (r <= 0) {
      *why = closedWhy(r);
      return false;
    }
    if (!direct) {
      bufEnd_ += static_cast<size_t>(r);
      continue;
    }
    dst_ += r;
    left_ -= static_cast<uint64_t>(r);
    if (left_ == 0) {
      inPayload_ = false;
      dst_ = nullptr;
      sink.onFrame(*this, in_);
    }
  }
  return true;
}

ssize_t Link::writeSome(iovec* iov, int n) {
  if (!rings_) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  size_t w = tx_.write(iov, n);
  if (w == 0) {  // full: ask the reader to ring when it makes room, then look once more
    tx_.header()->writerWaiting.store(1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w = tx_.write(iov, n);
    if (w == 0) {
      errno = EAGAIN;
      return -1;
    }
    tx_.header()->writerWaiting.store(0);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the bytes before the look at sleepers
  if (tx_.header()->sleepers.load() > 0) ringDoorbell();
  return static_cast<ssize_t>(w);
}

ssize_t Link::readSome(char* to, size_t want) {
  if (!rings_) return ::recv(fd_, to, want, MSG_DONTWAIT);
  const size_t n = rx_.read(to, want);
  if (n == 0) {
    if (peerClosed_) return 0;  // what the peer wrote before it left has all been read
    errno = EAGAIN;
    return -1;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_.header()->writerWaiting.load()) {
    rx_.header()->writerWaiting.store(0);
    ringDoorbell();
  }
  return static_cast<ssize_t>(n);
}

void Link::ringDoorbell() {
  const char one = 1;
  (void)!::send(fd_, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT);  // a full socket has a doorbell waiting already
}

bool Link::drainDoorbells(std::string* why) {
  char bells[64];
  while (fd_ >= 0) {
    const ssize_t r = ::recv(fd_, bells, sizeof(bells), MSG_DONTWAIT);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    peerClosed_ = true;  // reported once the ring is empty: its last frames (a NACK) count
    *why = closedWhy(r);
    return true;
  }
  return true;
}

void Link::useRings(std::unique_ptr<RingPair> rings, bool connecting) {
  rings_ = std::move(rings);
  tx_ = rings_->ring(connecting ? 0 : 1);
  rx_ = rings_->ring(connecting ? 1 : 0);
  bufStart_ = bufEnd_ = 0;  // what the socket brought after the hello: doorbells
}

bool Link::sleepOnRing() {
  rx_.header()->sleepers.fetch_add(1);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return rx_.readable() > 0;
}

void Link::wakeFromRing() { rx_.header()->sleepers.fetch_sub(1); }

bool Link::takeHeader() {
  if (bufEnd_ - bufStart_ < sizeof(Frame)) return false;
  std::memcpy(&in_, buf_.data() + bufStart_, sizeof(Frame));
  bufStart_ += sizeof(Frame);
  return true;
}

bool Link::midPayload(Kind kind, uint64_t id) const {
  if (inPayload_ && in_.kind == kind && in_.id == id) return true;
  for (const Out& o : out_)
    if (o.done > 0 && o.f.kind == kind && o.f.id == id) return true;
  return false;
}

}  // namespace chorus::p2p
