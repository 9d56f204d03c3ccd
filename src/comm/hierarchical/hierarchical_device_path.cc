// CUDA tensors across hosts, Horovod's hierarchical way: NCCL within each host
// (reduce-scatter, then allgather) and the host's slice allreduced across hosts
// over TCP or MPI (the staged path over the set's cross communicator), so that
// each byte crosses the network once per host, not once per rank.
#include <algorithm>
#include <vector>

#include "comm/device_path.h"
#include "device/device_handles.h"

namespace chorus {

namespace {

class HierarchicalDevicePath final : public DevicePath {
 public:
  HierarchicalDevicePath(std::shared_ptr<DeviceBackend> b, int ordinal, std::unique_ptr<DevicePath> local,
                         std::unique_ptr<DevicePath> cross, std::unique_ptr<DevicePath> flat, int localRank,
                         int localSize)
      : b_(std::move(b)),
        local_(std::move(local)),
        cross_(std::move(cross)),
        flat_(std::move(flat)),
        localRank_(localRank),
        localSize_(localSize),
        slice_(b_, ordinal),
        zeros_(b_, ordinal) {}

  const char* transport() const override { return "HIERARCHICAL"; }

  void allreduce(void* buf, const void* in, size_t count, DataType dtype, ReduceOp op, double scale,
                 void* stream) override {
    const size_t esize = dtypeSize(dtype);
    std::vector<size_t> counts(localSize_), bytes(localSize_);
    for (int i = 0; i < localSize_; ++i) {
      counts[i] = count / localSize_ + (static_cast<size_t>(i) < count % localSize_ ? 1 : 0);
      bytes[i] = counts[i] * esize;
    }
    void* slice = slice_.reserve(std::max<size_t>(counts[localRank_] * esize, 1));
    // (Average reduces as Sum until the cross step, which applies the whole set's scale.)
    local_->reducescatter(in, slice, counts, dtype, op, 1.0, stream);
    cross_->allreduce(slice, slice, counts[localRank_], dtype, op, scale, stream);
    local_->allgatherv(slice, buf, bytes, stream);
  }
  void allreduceJoined(size_t count, DataType dtype, ReduceOp op, double scale, void* stream) override {
    void* z = zeros_.zeroed(count * dtypeSize(dtype), stream);
    allreduce(z, z, count, dtype, op, scale, stream);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes, void* stream) override {
    flat_->allgatherv(in, out, bytes, stream);
  }
  void broadcast(void* buf, size_t bytes, int root, void* stream) override { flat_->broadcast(buf, bytes, root, stream); }
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out, const std::vector<size_t>& recvBytes,
                 void* stream) override {
    flat_->alltoallv(in, sendBytes, out, recvBytes, stream);
  }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                     double scale, void* stream) override {
    flat_->reducescatter(in, out, counts, dtype, op, scale, stream);
  }
  void abort() override {
    local_->abort();
    cross_->abort();
    flat_->abort();
  }

 private:
  std::shared_ptr<DeviceBackend> b_;
  std::unique_ptr<DevicePath> local_, cross_, flat_;
  int localRank_, localSize_;
  DeviceBuffer slice_, zeros_;
};

}  // namespace

std::unique_ptr<DevicePath> makeHierarchicalPath(const std::shared_ptr<DeviceBackend>& backend, int ordinal,
                                                 std::unique_ptr<DevicePath> local, std::unique_ptr<DevicePath> cross,
                                                 std::unique_ptr<DevicePath> flat, int localRank, int localSize) {
  return std::make_unique<HierarchicalDevicePath>(backend, ordinal, std::move(local), std::move(cross),
                                                  std::move(flat), localRank, localSize);
}

}  // namespace chorus
