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
  ~Buffer();
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;

  char* bytes() const { return data_; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }
  void zero() { if (size_) std::memset(data_, 0, size_); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

}  // namespace chorus::zero
