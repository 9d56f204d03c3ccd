#pragma once
// Where the ZeRO engine's buffers live and how it works on them: host memory
// with the CPU kernels, or one device through the device seam, its work queued
// in order on one stream. The engine's logic is the same over both; the host
// stand-in runs the device variant in CI.
#include <cstddef>
#include <memory>

#include "chorus/types.h"
#include "chorus/work.h"
#include "device/device_backend.h"
#include "zero/buffer.h"
#include "zero/hyper.h"
#include "zero/optimizer_step.h"

namespace chorus::zero {

class Memory {
 public:
  virtual ~Memory() = default;
  // Tensor::device of the buffers it makes (kHostDevice on the host), and the
  // stream the collectives on them are ordered on (null on the host).
  virtual int device() const = 0;
  virtual void* stream() const = 0;
  // Whether p is in this memory's device (not host-addressable).
  virtual bool onDevice(const void* p) const = 0;
  // Zeroed model-dtype buffers that collectives read and write (host: shared
  // memory that the other local ranks can reach).
  virtual Buffer collective(size_t bytes) = 0;
  // A zeroed working buffer of the engine's own (not shared with other ranks).
  virtual Buffer scratch(size_t bytes) = 0;
  // Zeroed fp32 master weights and optimizer state: here, or offloaded to
  // (pinned when pin) host memory.
  virtual Buffer state(size_t bytes, bool offloaded, bool pin) = 0;
  // Any direction between this memory and the host.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void accumulate(DataType dtype, void* dst, const void* src, size_t n) = 0;  // dst += src
  virtual void toFloat(float* dst, const void* src, DataType dtype, size_t n) = 0;
  virtual void fromFloat(void* dst, const float* src, DataType dtype, size_t n) = 0;
  virtual void scale(float* p, size_t n, float factor) = 0;
  // Sum of squares of n elements; waits for the work queued before it.
  virtual double sumSquares(const void* src, DataType dtype, size_t n) = 0;
  // One run of the optimizer over this memory's partition (RunArgs as the CPU step's).
  virtual void optimizer(OptimKind kind, const GroupHyper& h, const RunArgs& a) = 0;
  // LAMB's two passes over one piece of a parameter (lambMomentsRun, lambApplyRun).
  // Host memory only: on a device the Python layer steps LAMB itself over the partition.
  virtual void lambMoments(const GroupHyper& h, const RunArgs& a, double* wsq, double* usq) = 0;
  virtual void lambApply(const GroupHyper& h, const RunArgs& a, float trust) = 0;
  // w's results are ready for the work queued here after this call.
  virtual void await(const Work& w) = 0;
  // Keeps `held` (a Work and its outputs, a gathered buffer) alive until the
  // work queued here so far is done, without holding the host (on the host:
  // dropped now).
  virtual void retire(std::shared_ptr<void> held) = 0;
  // The sum of squares of several runs: begun, added to on the device, read once.
  virtual void normBegin() = 0;
  virtual void normAdd(const void* src, DataType dtype, size_t n) = 0;
  virtual double normEnd() = 0;
  // The host waits for everything queued.
  virtual void sync() = 0;
};

std::unique_ptr<Memory> hostMemory();
// The caller's device work on `stream` (null: the legacy default stream,
// which torch's default stream is) is ordered before the engine's. Offloaded
// optimizer steps move offloadChunkElems elements per chunk.
std::unique_ptr<Memory> deviceMemory(std::shared_ptr<DeviceBackend> backend, int ordinal, void* stream,
                                     size_t offloadChunkElems = size_t{4} << 20);

}  // namespace chorus::zero
