#pragma once
// One collective of chorus-bench: how to size it, run it, and check it.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::bench {

enum class BenchOp { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };
const char* benchOpName(BenchOp op);
BenchOp parseBenchOp(const std::string& name);
// nccl-tests' bus bandwidth factor for n ranks.
double busFactor(BenchOp op, int n);

// Who allocates the buffers.
struct BufferOwners {
  // Chorus allocates the outputs of allgather, alltoall and reducescatter
  // (Horovod's API returns new tensors) instead of writing into the bench's
  // buffers; the last `sets` outputs are held, so that they rotate too.
  // Allreduce's outputs come from chorus::allocateShared.
  bool chorusOutputs = false;
  // The inputs come from chorus::allocateShared (as ZeRO's gradient buckets).
  bool sharedInputs = false;
};

// Buffers for one size. `bytes` is what nccl-tests calls size: the whole
// buffer for allreduce/broadcast, the gathered output for allgather, the input
// for reducescatter, the send buffer for alltoall.
class BenchCase {
 public:
  // sets: how many buffer sets to rotate through, so that caches do not flatter.
  BenchCase(Runtime& rt, BenchOp op, DataType dtype, ReduceOp redop, size_t bytes, int sets = 1, BufferOwners owners = {});
  size_t bytes() const { return bytes_; }
  int64_t count() const { return count_; }
  // Runs the op once on buffer set i % sets.
  void run(int i = 0);
  // Fills inputs with rank-dependent values, runs once, and returns how many
  // output elements differ from the value computed here in float64.
  int64_t check();

 private:
  void fillInput();
  void hold(int i, Work w);
  const char* output0() const;
  double expected(int64_t outIndex) const;

  Runtime& rt_;
  BenchOp op_;
  DataType dtype_;
  ReduceOp redop_;
  int rank_, size_;
  size_t bytes_ = 0;
  int64_t count_ = 0;   // elements of the input on this rank
  int64_t outCount_ = 0;
  std::vector<std::shared_ptr<void>> in_;  // by buffer set (zeroed or shared)
  std::vector<std::shared_ptr<void>> out_;  // the bench's outputs, by buffer set (zeroed or shared)
  bool chorusOutputs_;
  std::vector<std::optional<Work>> held_;  // chorus-allocated outputs, by buffer set
  std::string name_;
};

}  // namespace chorus::bench
