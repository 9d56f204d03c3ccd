#include "comm/p2p/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace chorus::p2p {

namespace {
constexpr size_t kStride = sizeof(RingHeader) + RingPair::kRingBytes;
constexpr size_t kSegment = 2 * kStride;
}  // namespace

size_t Ring::write(const iovec* iov, int n) {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  size_t room = cap_ - static_cast<size_t>(head - tail), written = 0;
  for (int i = 0; i < n && room > 0; ++i) {
    const char* src = static_cast<const char*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, room);
    while (len > 0) {
      const size_t at = static_cast<size_t>((head + written) % cap_);
      const size_t chunk = std::min(len, cap_ - at);
      std::memcpy(data_ + at, src, chunk);
      src += chunk;
      len -= chunk;
      written += chunk;
      room -= chunk;
    }
  }
  if (written) h_->head.store(head + written, std::memory_order_release);
  return written;
}

size_t Ring::read(char* dst, size_t max) {
  const uint64_t tail = h_->tail.load(std::memory_order_relaxed);
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  size_t n = std::min(max, static_cast<size_t>(head - tail)), done = 0;
  while (done < n) {
    const size_t at = static_cast<size_t>((tail + done) % cap_);
    const size_t chunk = std::min(n - done, cap_ - at);
    std::memcpy(dst + done, data_ + at, chunk);
    done += chunk;
  }
  if (n) h_->tail.store(tail + n, std::memory_order_release);
  return n;
}

size_t Ring::readable() const {
  return static_cast<size_t>(h_->head.load(std::memory_order_acquire) - h_->tail.load(std::memory_order_relaxed));
}

RingPair* RingPair::create(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(kSegment)) == 0)
    base = mmap(nullptr, kSegment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  for (int i = 0; i < 2; ++i) new (static_cast<char*>(base) + i * kStride) RingHeader();
  return new RingPair(base, kSegment);
}

RingPair* RingPair::attach(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  shm_unlink(name.c_str());  // both ranks hold it now (or the connecting one gave up)
  if (fd < 0) return nullptr;
  void* base = mmap(nullptr, kSegment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  return new RingPair(base, kSegment);
}

RingPair::~RingPair() { munmap(base_, bytes_); }

Ring RingPair::ring(int i) const {
  char* at = static_cast<char*>(base_) + i * kStride;
  return Ring(reinterpret_cast<RingHeader*>(at), at + sizeof(RingHeader), kRingBytes);
}

}  // namespace chorus::p2p
