#pragma once
// A process set spanning hosts: allreduce and allgather go through shared memory
// within each host and TCP (or MPI) between hosts; the other collectives use a
// flat communicator over all members. When every host holds as many ranks, large
// ones go by slices: an allreduce is reduce-scattered within each host, each rank
// allreduces its slice with the ranks of its local index on the other hosts, and
// the slices are gathered back within the host (allgather: each rank exchanges
// its own piece across hosts, then the host shares them); otherwise, and for
// small ones, one leader per host carries it all.
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace chorus {

struct HierarchyLayout {
  int rank = 0;                              // rank within the set
  std::vector<std::vector<int>> hostRanks;   // set ranks of each host, hosts in order of first rank
  int host = 0;                              // index of my host
};

class HierarchicalCommunicator : public Communicator {
 public:
  HierarchicalCommunicator(HierarchyLayout layout, std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> cross, std::unique_ptr<Communicator> flat,
                           bool hierarchicalAllreduce, bool hierarchicalAllgather);

  int rank() const override { return layout_.rank; }
  int size() const override { return flat_->size(); }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allreduceBitsOr(uint64_t* words, size_t count) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override { flat_->broadcast(buf, bytes, root); }
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                 const std::vector<size_t>& recvBytes, size_t largestPiece) override {
    flat_->alltoallv(in, sendBytes, out, recvBytes, largestPiece);
  }
  void reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    flat_->reducescatter(buf, out, counts, dtype, op);
  }
  CommTraits traits() const override {
    return {.transport = "HIERARCHICAL", .reducescatterReadsOnly = flat_->traits().reducescatterReadsOnly,
            .batchesRequests = true};
  }
  void abort() override {
    for (auto* c : {local_.get(), cross_.get(), flat_.get()})
      if (c) c->abort();
  }
  void barrier() override;
  HostSplit hostSplit() override { return sliced_ ? HostSplit{local_.get(), cross_.get()} : HostSplit{}; }
  // The host's shared memory's, and whether each of the two goes by hosts.
  CommTuning tuning() const override {
    CommTuning t = local_->tuning();
    t.hierarchicalAllreduce = hierAllreduce_;
    t.hierarchicalAllgather = hierAllgather_;
    return t;
  }
  void setTuning(const CommTuning& t) override {
    local_->setTuning(t);
    if (t.hierarchicalAllreduce >= 0) hierAllreduce_ = t.hierarchicalAllreduce > 0;
    if (t.hierarchicalAllgather >= 0) hierAllgather_ = t.hierarchicalAllgather > 0;
  }

 private:
  bool leader() const { return local_->rank() == 0; }
  // Hosts hold as many ranks each, so every rank has a cross communicator:
  // allreduce goes by slices.
  bool sliced() const { return sliced_; }
  void allreduceSliced(void* buf, size_t count, DataType dtype, ReduceOp op);
  void allgatherSliced(const void* in, void* out, const std::vector<size_t>& bytes, size_t total);

  HierarchyLayout layout_;
  std::unique_ptr<Communicator> local_, cross_, flat_;
  bool hierAllreduce_, hierAllgather_;
  bool sliced_;
  std::vector<char> scratch_, slice_;
};

}  // namespace chorus
