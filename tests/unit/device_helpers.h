#pragma once
// Device tests' helpers over the host stand-in: its "GPU" buffers, how a
// framework reads a result, and a runtime configured with a stand-in.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "chorus/runtime.h"
#include "device/host_stand_in.h"
#include "harness.h"

namespace chorus::testing {

// A "GPU" buffer of the stand-in, filled from and read back into host values.
class DevBuf {
 public:
  DevBuf(DeviceBackend& b, DataType dtype, Shape shape, int device = 0)
      : b_(b), host_(dtype, shape), dtype_(dtype), shape_(std::move(shape)), device_(device) {
    p_ = b_.allocDevice(device, host_.numel() * dtypeSize(dtype));
  }
  ~DevBuf() { b_.freeDevice(p_); }
  Tensor tensor() { return Tensor{p_, dtype_, shape_, device_}; }
  HostBuffer& host() { return host_; }
  // Uploads host() on stream (after `delay`, as a late kernel of the framework would).
  void upload(void* stream, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    void* dst = p_;
    const void* src = host_.tensor().data;
    const size_t bytes = host_.numel() * dtypeSize(dtype_);
    DeviceBackend* b = &b_;
    standInEnqueue(b_, stream, [=] {
      std::this_thread::sleep_for(delay);
      std::memcpy(standInHostAddress(*b, dst), src, bytes);
    });
  }
  double read(int64_t i) {  // (after the stream that wrote it was synchronized)
    return readAs(standInHostAddress(b_, p_), dtype_, i);
  }

 private:
  DeviceBackend& b_;
  HostBuffer host_;
  DataType dtype_;
  Shape shape_;
  int device_;
  void* p_;
};

// As a framework reads results: its stream (the default one, where the test's
// uploads ran) waits for the op, and the host synchronizes that stream.
inline void hostSees(const Work& w, DeviceBackend& dev) {
  w.wait();
  w.streamWait(nullptr);
  dev.synchronizeStream(nullptr);
}

// Ranks share one stand-in, as ranks share one GPU (the staged path), unless
// ownGpu gives each rank a GPU identity of its own.
inline ConfigTweak withDevice(const std::shared_ptr<DeviceBackend>& dev, const std::string& ops = "auto",
                       int64_t chunk = 4096) {
  return [=](Config& c) {
    c.device = dev;
    c.gpuOperations = ops;
    c.gpuStageChunkBytes = chunk;
  };
}

}  // namespace chorus::testing
