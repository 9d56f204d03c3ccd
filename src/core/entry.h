#pragma once
// One rank's side of one tensor in flight: the request plus its buffers.
#include <chrono>
#include <unordered_map>
#include <memory>
#include <string>

#include "chorus/runtime.h"
#include "core/message.h"
#include "core/work_state.h"
#include "device/device_handles.h"

namespace chorus {

struct Entry {
  Request req;
  Tensor input;
  Tensor output;    // allreduce/broadcast: given by the caller; others: allocated later
  Allocator alloc;  // null: chorus allocates and the Work owns the storage
  std::shared_ptr<WorkState> work;
  size_t part = 0;  // index of this tensor within its Work
  // CUDA tensors: recorded on the caller's stream at enqueue; chorus's stream waits for it.
  std::shared_ptr<DeviceEvent> ready;
  std::chrono::steady_clock::time_point enqueued;
};

// Looked up by name several times per tensor and cycle: hashed, not ordered.
using EntryTable = std::unordered_map<std::string, Entry>;

}  // namespace chorus
