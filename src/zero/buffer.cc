#include "zero/buffer.h"

#include <sys/mman.h>

#include <new>

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

Buffer::~Buffer() {
  if (pinned_) ::munlock(data_, (size_ + 63) / 64 * 64);
  std::free(data_);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    data_ = o.data_;
    size_ = o.size_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.pinned_ = false;
  }
  return *this;
}

}  // namespace chorus::zero
