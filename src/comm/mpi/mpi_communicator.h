#pragma once
// Collectives over an MPI communicator (CHORUS_CPU_OPERATIONS=mpi).
#include <mpi.h>

#include "comm/communicator.h"

namespace chorus {

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);  // takes ownership
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allreduceBitsOr(uint64_t* words, size_t count) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, size_t largestPiece) override;
  void reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  CommTraits traits() const override { return {.transport = "MPI", .reducescatterReadsOnly = true}; }
  void barrier() override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace chorus
