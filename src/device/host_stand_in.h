#pragma once
// The device interface in host memory, for unit tests of chorus's device logic
// (ready events, staging, completion, path choice) on machines with no GPU.
// Streams are worker threads that run their queue in order, so work queued on
// a stream really is asynchronous to the host and ordered only by events, as
// on a GPU. Each thread has a current device, a null stream is the current
// device's default stream, and rules CUDA enforces are enforced: a kernel goes
// to a stream of the current device, an event is recorded on a stream of its
// own device. It is not a GPU: a test that passes only here is not a GPU test.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/device_backend.h"

namespace chorus {

struct HostStandInOptions {
  int devices = 1;
  // Every device's identity is this string plus its ordinal; give ranks the
  // same prefix to make them share a "GPU", different ones for their own.
  std::string identityPrefix = "standin:";
};

std::shared_ptr<DeviceBackend> makeHostStandIn(HostStandInOptions opts = {});

// Device memory is not host-addressable, as on a GPU: its addresses lie in a
// range the host cannot touch (host code that reads it faults). Tests reach
// the host memory behind a device address (or any other address, unchanged)
// with this, from a stream task or after synchronizing.
void* standInHostAddress(DeviceBackend& standIn, const void* p);

// The devices whose context this stand-in holds. As in CUDA, a thread's first
// call with no device made current creates device 0's: a test of a rank on
// device 1 checks that nothing touched device 0.
std::vector<int> standInContexts(DeviceBackend& standIn);

// From now on every call that would reach the GPU throws `message`, as after a
// sticky CUDA error (an illegal address): tests of what chorus does then.
void standInBreak(DeviceBackend& standIn, const std::string& message);

// Queues fn on a stand-in stream (tests: a "kernel" of the framework that
// writes a tensor late, to check that chorus waits for the ready event).
void standInEnqueue(DeviceBackend& standIn, void* stream, std::function<void()> fn);

}  // namespace chorus
