#pragma once
// A pair's byte streams in shared memory (one ring each way), for two ranks of
// one host: a frame is a memcpy away, with no system call. The pair's Unix
// socket stays as the doorbell: a writer rings it only when the reader sleeps
// in poll, and a reader only when the writer waits for room; and it still shows
// the peer's death.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/uio.h>

namespace chorus::p2p {

struct RingHeader {
  alignas(64) std::atomic<uint64_t> head{0};  // bytes ever written (the writer's)
  alignas(64) std::atomic<uint64_t> tail{0};  // bytes ever read (the reader's)
  alignas(64) std::atomic<int32_t> sleepers{0};  // the reader's threads asleep in poll
  std::atomic<int32_t> writerWaiting{0};         // the writer waits for room
};

class Ring {
 public:
  Ring() = default;
  Ring(RingHeader* h, char* data, size_t cap) : h_(h), data_(data), cap_(cap) {}
  bool valid() const { return h_ != nullptr; }
  // Copies as much of the iovecs as fits; returns the bytes written.
  size_t write(const iovec* iov, int n);
  // Copies up to max bytes out; returns how many.
  size_t read(char* dst, size_t max);
  size_t readable() const;
  RingHeader* header() const { return h_; }

 private:
  RingHeader* h_ = nullptr;
  char* data_ = nullptr;
  size_t cap_ = 0;
};

// The two rings of a pair in one mapping: ring 0 carries the connecting rank's
// bytes, ring 1 the accepting rank's.
class RingPair {
 public:
  static constexpr size_t kRingBytes = 256 << 10;  // a 64 KiB eager frame fits four times
  // The connecting rank creates the segment under name; null when the system refuses.
  static RingPair* create(const std::string& name);
  // The accepting rank maps it and removes the name; null when it cannot.
  static RingPair* attach(const std::string& name);
  ~RingPair();
  Ring ring(int i) const;

 private:
  RingPair(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  void* base_;
  size_t bytes_;
};

}  // namespace chorus::p2p
