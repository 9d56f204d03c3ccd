#pragma once
// One TCP connection of the point-to-point engine: frames out (a queue written
// as far as the socket takes, never blocking) and frames in (a parser that
// hands each header to a sink, which says where the payload goes).
#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/p2p/shm_ring.h"

namespace chorus::p2p {

enum class Kind : uint32_t {
  kHello = 0x70327031,  // set: 0, tag: sender's rank, id: its pid, addr: the job's token
  kEager,               // a small send with its payload
  kRts,                 // a large send announced; addr: its buffer when the receiver may read it (CMA)
  kCts,                 // receiver to sender: stream the data of send `id`
  kData,                // the payload of send `id`
  kDone,                // receiver to sender: send `id` arrived
  kNack,                // either way: op `id` failed; the payload is the reason
};

struct Frame {
  Kind kind;
  int32_t set;
  int32_t tag;
  uint32_t dtype;
  uint64_t id;
  uint64_t bytes;  // of the message (kEager, kRts, kData) or of this frame's payload (kNack)
  uint64_t addr;
};
static_assert(sizeof(Frame) == 40, "the wire format");

// The bytes that follow a frame on the wire.
inline uint64_t payloadBytes(const Frame& f) {
  return f.kind == Kind::kEager || f.kind == Kind::kData || f.kind == Kind::kNack ? f.bytes : 0;
}

class Link {
 public:
  struct Sink {
    // A whole header arrived: where its payload (payloadBytes) goes; null discards it.
    virtual char* onHeader(Link& link, const Frame& f) = 0;
    // The payload of f is in place (also called for frames without one).
    virtual void onFrame(Link& link, const Frame& f) = 0;

   protected:
    ~Sink() = default;
  };

  Link(int fd, int peer, bool outgoing) : fd_(fd), peer_(peer), outgoing_(outgoing) {}
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int fd() const { return fd_; }
  int peer() const { return peer_; }
  void setPeer(int peer) { peer_ = peer; }
  // Made by this rank (carries its sends, and the replies to them) or accepted
  // (carries the peer's sends, and this rank's replies).
  bool outgoing() const { return outgoing_; }
  bool open() const { return fd_ >= 0; }

  // Queues a frame and its payload, which must stay valid until written; with
  // copy, what the next flush leaves unwritten is copied (the caller's memory is free then).
  void queue(const Frame& f, const void* payload = nullptr, size_t bytes = 0, bool copy = false);
  // Queues a frame with a copy of its payload.
  void queueCopy(const Frame& f, const std::string& payload);
  bool wantsWrite() const { return !out_.empty(); }
  // Writes what the socket takes now. False (with the reason) when the peer is gone.
  bool flush(std::string* why);
  // Reads what has arrived, calling the sink per frame. False (with the reason)
  // when the peer closed the connection or it failed.
  bool pump(Sink& sink, std::string* why);
  // A payload is being read or written for a frame with this id right now.
  bool midPayload(Kind kind, uint64_t id) const;
  // Shuts the connection; the peer sees it closed.
  void close();

  // Same host: from now on frames go through the pair's rings, and the socket
  // carries doorbells only (connecting: this rank made the connection).
  void useRings(std::unique_ptr<RingPair> rings, bool connecting);
  bool hasRings() const { return rings_ != nullptr; }
  // Around a poll that may sleep: the first says so to the peer's writer and
  // returns true when bytes are already there (so do not sleep); the second undoes it.
  bool sleepOnRing();
  void wakeFromRing();

 private:
  struct Out {
    Frame f;
    const char* payload;
    size_t bytes;
    bool copy;
    std::vector<char> owned;
    size_t done = 0;  // of header and payload
  };
  int fd_;
  int peer_;
  bool outgoing_;
  std::deque<Out> out_;
  // Takes a whole header from buffered bytes (false: not all there yet).
  bool takeHeader();
  // The stream's system calls, or the rings' copies (-1 with errno EAGAIN: nothing now).
  ssize_t writeSome(iovec* iov, int n);
  ssize_t readSome(char* to, size_t want);
  bool drainDoorbells(std::string* why);
  void ringDoorbell();
  std::unique_ptr<RingPair> rings_;
  Ring tx_, rx_;
  bool peerClosed_ = false;  // the doorbell socket closed: the ring is read to its end, then it is over
  // Bytes read ahead: small frames cost one read for several (header and payload together).
  std::vector<char> buf_;
  size_t bufStart_ = 0, bufEnd_ = 0;
  // The frame being read.
  Frame in_{};
  char* dst_ = nullptr;  // where its payload goes (null: discarded)
  uint64_t left_ = 0;    // payload bytes still to read
  bool inPayload_ = false;
};

}  // namespace chorus::p2p
