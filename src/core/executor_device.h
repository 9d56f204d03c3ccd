#pragma once
// The executor's side of CUDA tensors: a set's device path (NCCL or staged),
// chorus's stream for the set, the device fusion buffer, ready and done events.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/device_path.h"
#include "core/entry.h"
#include "core/timeline.h"
#include "device/device_handles.h"

namespace chorus {

struct DeviceSettings {
  // The backend (opened on first use); throws saying why none can be used.
  std::function<std::shared_ptr<DeviceBackend>()> backend;
  DevicePathOptions path;
  std::string host;  // this rank's host name (ranks on one host may share a GPU)
};

class DeviceRunner {
 public:
  using Release = std::function<void(const std::string&)>;
  // Collective over the set (the path's choice): every member makes it at the
  // same response. ordinal: this rank's device for the set's CUDA tensors.
  DeviceRunner(const DeviceSettings& s, int ordinal, Communicator& cpu, Timeline* timeline, int32_t setId);
  ~DeviceRunner();  // after the work queued on its stream (it uses the buffers)
  const char* transport() const { return path_->transport(); }
  const std::string& reason() const { return why_; }
  int ordinal() const { return ordinal_; }

  // A fused allreduce of CUDA tensors (ranks that joined take part with zeros).
  void allreduce(const Response* const* group, size_t n, EntryTable& entries, const Release& release);
  // allgather, broadcast, alltoall, reducescatter of one CUDA tensor.
  void run(const Response& r, EntryTable& entries, const Release& release);
  void abort() { path_->abort(); }

 private:
  void waitReady(const Entry& e);
  void* output(Entry& e, const Shape& shape, std::exception_ptr* err);
  void finish(EntryTable& entries, EntryTable::iterator it, const Release& release, std::exception_ptr err = nullptr);

  std::shared_ptr<DeviceBackend> b_;
  int ordinal_;
  Communicator& cpu_;
  Timeline* timeline_;
  int32_t setId_;
  std::string why_;
  DeviceStream stream_;
  std::unique_ptr<DevicePath> path_;
  DeviceBuffer fusion_, joined_;  // joined_: a rank that joined takes part from zeros here
};

}  // namespace chorus
