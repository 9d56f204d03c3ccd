#pragma once
// An aligned, zeroed host buffer; optionally page-locked (pin_memory).
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace chorus::zero {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes, bool pin = false);
  // From chorus::allocateShared (for 1 MiB and more): collectives whose outputs
  // land here can be written by the other local ranks directly.
  static Buffer shared(size_t bytes);
  // Memory someone else allocated (a device's, pinned by a backend), freed with mem.
  static Buffer adopt(std::shared_ptr<void> mem, size_t bytes, bool pinned);
  ~Buffer();
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;

  char* bytes() const { return data_; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_ || adoptedPinned_; }
  void zero() { if (size_) std::memset(data_, 0, size_); }  // (host memory only)

 private:
  void release();

  char* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;         // mlock'ed by this buffer
  bool adoptedPinned_ = false;  // pinned by whoever allocated it
  std::shared_ptr<void> shared_;  // owns data_ when set
};

}  // namespace chorus::zero
