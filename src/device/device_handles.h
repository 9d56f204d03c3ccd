#pragma once
// Owning handles of a backend's streams, events and buffers.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "device/device_backend.h"

namespace chorus {

// Makes ordinal the calling thread's device for a scope (kernel launches and
// the null stream follow it). The previous device comes back only if it has a
// context: restoring a device 0 nobody used would create one. ordinal < 0: none.
class CurrentDevice {
 public:
  CurrentDevice(DeviceBackend& b, int ordinal) : b_(b) {
    if (ordinal < 0) return;
    const int prev = b.current();
    if (prev == ordinal && b.active(ordinal)) return;
    b.setCurrent(ordinal);
    if (prev != ordinal && b.active(prev)) prev_ = prev;
  }
  ~CurrentDevice() {
    if (prev_ < 0) return;
    try {
      b_.setCurrent(prev_);
    } catch (...) {
    }
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  DeviceBackend& b_;
  int prev_ = -1;
};

class DeviceEvent {
 public:
  DeviceEvent(std::shared_ptr<DeviceBackend> b, int ordinal)
      : b_(std::move(b)), ordinal_(ordinal), e_(b_->createEvent(ordinal)) {}
  ~DeviceEvent() {
    try {
      b_->destroyEvent(e_);
    } catch (...) {
    }
  }
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  void* get() const { return e_; }
  int ordinal() const { return ordinal_; }
  DeviceBackend& backend() const { return *b_; }

 private:
  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;
  void* e_;
};

class DeviceStream {
 public:
  DeviceStream(std::shared_ptr<DeviceBackend> b, int ordinal) : b_(std::move(b)), s_(b_->createStream(ordinal)) {}
  ~DeviceStream() {
    try {
      b_->synchronizeStream(s_);
      b_->destroyStream(s_);
    } catch (...) {
    }
  }
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  void* get() const { return s_; }

 private:
  std::shared_ptr<DeviceBackend> b_;
  void* s_;
};

// A buffer that grows (device or pinned host memory), freed with the backend.
class DeviceBuffer {
 public:
  DeviceBuffer(std::shared_ptr<DeviceBackend> b, int ordinal) : b_(std::move(b)), ordinal_(ordinal) {}
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least bytes; contents are lost when it grows (the caller ordered any
  // work using the old memory before this call).
  void* reserve(size_t bytes) {
    if (bytes > size_ || !p_) {
      release();
      p_ = ordinal_ >= 0 ? b_->allocDevice(ordinal_, bytes) : b_->allocPinned(bytes);
      size_ = bytes;
    }
    return p_;
  }
  // At least bytes, all zeros: what a rank that joined contributes (rare, so the
  // zeros come from the host and the stream is waited for).
  void* zeroed(size_t bytes, void* stream) {
    void* p = reserve(std::max<size_t>(bytes, 1));
    std::vector<char> zeros(bytes, 0);
    b_->copy(p, zeros.data(), bytes, stream);
    b_->synchronizeStream(stream);
    return p;
  }
  void* get() const { return p_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (!p_) return;
    try {
      if (ordinal_ >= 0) b_->freeDevice(p_);
      else b_->freePinned(p_);
    } catch (...) {
    }
    p_ = nullptr;
    size_ = 0;
  }
  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;  // -1: pinned host memory
  void* p_ = nullptr;
  size_t size_ = 0;
};

}  // namespace chorus
