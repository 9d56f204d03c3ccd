#include "comm/p2p/p2p_link.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace chorus::p2p {

namespace {
// Enough to take one small frame and its payload per read, no more: the
// scratch only ever holds payloads that are thrown away.
constexpr size_t kScratchBytes = 64 << 10;

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
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    const ssize_t r = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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
  while (fd_ >= 0) {
    if (!inPayload_) {
      const ssize_t r = ::recv(fd_, reinterpret_cast<char*>(&in_) + inGot_, sizeof(Frame) - inGot_, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (r <= 0) {
        *why = closedWhy(r);
        return false;
      }
      inGot_ += static_cast<size_t>(r);
      if (inGot_ < sizeof(Frame)) continue;
      inGot_ = 0;
      left_ = payloadBytes(in_);
      dst_ = left_ ? sink.onHeader(*this, in_) : nullptr;
      if (fd_ < 0) return true;  // the sink closed this link
      if (left_ == 0) {
        sink.onFrame(*this, in_);
        continue;
      }
      inPayload_ = true;
    }
    char* to = dst_;
    size_t want = left_;
    if (!to) {
      if (scratch_.empty()) scratch_.resize(kScratchBytes);
      to = scratch_.data();
      want = std::min<uint64_t>(left_, scratch_.size());
    }
    const ssize_t r = ::recv(fd_, to, want, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (r <= 0) {
      *why = closedWhy(r);
      return false;
    }
    left_ -= static_cast<uint64_t>(r);
    if (dst_) dst_ += r;
    if (left_ == 0) {
      inPayload_ = false;
      dst_ = nullptr;
      sink.onFrame(*this, in_);
    }
  }
  return true;
}

bool Link::midPayload(Kind kind, uint64_t id) const {
  if (inPayload_ && in_.kind == kind && in_.id == id) return true;
  for (const Out& o : out_)
    if (o.done > 0 && o.f.kind == kind && o.f.id == id) return true;
  return false;
}

}  // namespace chorus::p2p
