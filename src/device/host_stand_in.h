#pragma once
// The device interface in host memory, for unit tests of chorus's device logic
// (ready events, staging, completion, path choice) on machines with no GPU.
// Streams are worker threads that run their queue in order, so work queued on
// a stream really is asynchronous to the host and ordered only by events, as
// on a GPU. It is not a GPU: a test that passes only here is not a GPU test.
#include <functional>
#include <memory>
#include <string>

#include "device/device_backend.h"

namespace chorus {

struct HostStandInOptions {
  int devices = 1;
  // Every device's identity is this string plus its ordinal; give ranks the
  // same prefix to make them share a "GPU", different ones for their own.
  std::string identityPrefix = "standin:";
};

std::shared_ptr<DeviceBackend> makeHostStandIn(HostStandInOptions opts = {});

// Queues fn on a stand-in stream (tests: a "kernel" of the framework that
// writes a tensor late, to check that chorus waits for the ready event).
void standInEnqueue(DeviceBackend& standIn, void* stream, std::function<void()> fn);

}  // namespace chorus
