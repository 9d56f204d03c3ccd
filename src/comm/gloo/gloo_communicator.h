#pragma once
#include <gloo/context.h>
#include <gloo/transport/device.h>

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "comm/gloo/direct_mesh.h"

namespace chorus {

class TransportDevice {
 public:
  std::shared_ptr<gloo::transport::Device> gloo;
};

class GlooCommunicator : public Communicator {
 public:
  // mesh carries the small messages; null only for a group of one.
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::unique_ptr<DirectMesh> mesh,
                   std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), mesh_(std::move(mesh)), timeout_(timeout) {}
  void abort() override {
    if (mesh_) mesh_->abort();
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allreduceBitsOr(uint64_t* words, size_t count) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, size_t largestPiece) override;
  void reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void barrier() override;
  CommTraits traits() const override { return {.transport = "TCP", .batchesRequests = true}; }

 private:
  // Small buffers: every rank sends its whole buffer to every other rank and
  // reduces locally in rank order (one message latency instead of a ring's 2(n-1)).
  void exchangeReduce(void* buf, size_t bytes, const std::function<void(void*, const void*, size_t)>& reduceInto);
  // A ring (reduce-scatter, then allgather) over the direct mesh, in chunks.
  void ringAllreduce(void* buf, size_t count, DataType dtype, ReduceOp op);

  std::shared_ptr<gloo::Context> ctx_;
  std::unique_ptr<DirectMesh> mesh_;
  std::vector<char> gather_;
  std::chrono::milliseconds timeout_;
  std::vector<char> recvScratch_;
};

}  // namespace chorus
