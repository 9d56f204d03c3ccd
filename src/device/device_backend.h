#pragma once
// The device seam: what chorus needs of an accelerator (streams, events, pinned
// and device memory, copies and a few kernels), behind one interface. CUDA
// implements it in libchorus_cuda, opened at run time (device/loader.h), so that
// libchorus builds and runs with no toolkit or driver; HostStandIn implements it
// in host memory for tests of the orchestration (not GPU tests).
//
// Streams and events are opaque handles (CUDA: cudaStream_t, cudaEvent_t); a
// null stream is the device's default stream. Work on a stream runs in order;
// every call here returns once the work is queued, except synchronize(),
// synchronizeStream() and the allocations. Failures throw chorus::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "chorus/types.h"
#include "reduce/cpu_optimizer.h"

namespace chorus {

// Bumped whenever this interface changes: a backend library built against
// another version is refused by the loader, not called.
inline constexpr int kDeviceBackendAbi = 2;

// One piece of a batched copy (into or out of a fusion buffer); scale != 1
// multiplies as it copies (dtype of the whole batch).
struct CopyItem {
  void* dst;
  const void* src;
  size_t bytes;
};


// One tensor of a fused optimizer step: the fp32 master weights and state are
// updated in place; low (null: none) also receives the new weights as 16 bits.
struct OptimTensor {
  float* master;
  float* state1;  // Adam: exp_avg; SGD: the momentum buffer
  float* state2;  // Adam: exp_avg_sq; SGD: unused
  const void* grad;
  void* low;
  size_t n;
};


class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;  // "cuda", "host stand-in"
  // The runtime's version, e.g. "CUDA runtime 13.0, driver 13.0".
  virtual std::string version() const = 0;
  virtual int count() const = 0;  // devices visible to this process
  virtual int current() const = 0;  // the calling thread's device
  virtual void setCurrent(int ordinal) = 0;
  // Whether this process already has the device's context: making a device
  // current that has none creates one (hundreds of MiB on a GPU nobody uses).
  virtual bool active(int ordinal) const = 0;
  // Names the physical device (PCI bus id): two ranks on one host with the same
  // identity share a GPU (NCCL refuses them; chorus stages through host memory).
  virtual std::string identity(int ordinal) const = 0;
  // The device that owns p, or -1 for host memory (pinned or not).
  virtual int deviceOf(const void* p) const = 0;

  virtual void* allocDevice(int ordinal, size_t bytes) = 0;
  virtual void freeDevice(void* p) = 0;
  virtual void* allocPinned(size_t bytes) = 0;  // page-locked host memory
  virtual void freePinned(void* p) = 0;

  virtual void* createStream(int ordinal) = 0;  // does not synchronize with the default stream
  virtual void destroyStream(void* stream) = 0;
  virtual void* createEvent(int ordinal) = 0;
  virtual void destroyEvent(void* event) = 0;
  virtual void record(void* event, void* stream) = 0;
  // Work queued on stream after this waits for event's last record (device side).
  virtual void streamWait(void* stream, void* event) = 0;
  virtual bool query(void* event) = 0;  // its last record has completed
  virtual void synchronize(void* event) = 0;  // the host waits for it
  virtual void synchronizeStream(void* stream) = 0;

  // Any direction (device, pinned or pageable host); asynchronous on stream
  // when the host side is pinned.
  virtual void copy(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void zero(void* dst, size_t bytes, void* stream) = 0;  // device memory
  // Many copies in one launch (the fusion buffer's pack and unpack).
  virtual void batchedCopy(const CopyItem* items, size_t n, void* stream) = 0;
  // dst[i] = src[i] * factor (dst may equal src), floating and integer dtypes.
  virtual void scale(DataType dtype, void* dst, const void* src, size_t n, double factor, void* stream) = 0;
  // Integer dtypes: buf[i] /= divisor, truncating toward zero (Average of integers).
  virtual void divide(DataType dtype, void* buf, size_t n, int64_t divisor, void* stream) = 0;
  // dst[i] = (to) src[i] between float16, bfloat16, float32 and float64.
  virtual void cast(DataType to, void* dst, DataType from, const void* src, size_t n, void* stream) = 0;
  // dst[i] = dst[i] op src[i] (Sum, Min, Max, Product; Average reduces as Sum).
  virtual void reduce(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, void* stream) = 0;

  // The ZeRO engine's optimizer: Adam over many tensors in one pass each
  // (gradients in gradDtype: float32, float16 or bfloat16; low in lowDtype:
  // float16 or bfloat16), matching the CPU step to float rounding.
  virtual void adam(const AdamCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors,
                    size_t n, void* stream) = 0;
  virtual void sgd(const SgdCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors,
                   size_t n, void* stream) = 0;
  // *out (one double in device memory) += the sum of squares of n floats of
  // dtype (float32, float16, bfloat16); inf and nan propagate (fp16's overflow check).
  virtual void sumSquares(DataType dtype, const void* src, size_t n, double* out, void* stream) = 0;
};

}  // namespace chorus
