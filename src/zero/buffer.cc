#include "zero/buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

#include "chorus/runtime.h"

namespace chorus::zero {

Buffer::Buffer(size_t bytes, bool pin) : size_(bytes) {
  if (!bytes) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = static_cast<char*>(std::aligned_alloc(64, rounded));
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
  // Page-locking is best effort: RLIMIT_MEMLOCK may refuse it; the caller can see pinned().
  if (pin) pinned_ = ::mlock(data_, rounded) == 0;
}

Buffer Buffer::shared(size_t bytes) {
  if (bytes < kSharedMinBytes) return Buffer(bytes);
  std::shared_ptr<void> mem = allocateShared(bytes);
  if (reinterpret_cast<uintptr_t>(mem.get()) % 64 != 0) return Buffer(bytes);  // a private fallback
  Buffer b;
  b.data_ = static_cast<char*>(mem.get());
  b.size_ = bytes;
  b.shared_ = std::move(mem);
  std::memset(b.data_, 0, bytes);  // the pool hands buffers out again
  return b;
}

Buffer Buffer::adopt(std::shared_ptr<void> mem, size_t bytes, bool pinned) {
  Buffer b;
  b.data_ = static_cast<char*>(mem.get());
  b.size_ = bytes;
  b.shared_ = std::move(mem);
  b.adoptedPinned_ = pinned;
  return b;
}

void Buffer::release() {
  if (shared_) {
    shared_.reset();
  } else {
    if (pinned_) ::munlock(data_, (size_ + 63) / 64 * 64);
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
  adoptedPinned_ = false;
}

Buffer::~Buffer() { release(); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    pinned_ = o.pinned_;
    shared_ = std::move(o.shared_);
    o.data_ = nullptr;
    o.size_ = 0;
    o.pinned_ = false;
    adoptedPinned_ = o.adoptedPinned_;
    o.adoptedPinned_ = false;
  }
  return *this;
}

}  // namespace chorus::zero
