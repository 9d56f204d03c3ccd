#pragma once
// chorus collectives on torch::Tensor (libtorch), and a DistributedOptimizer
// that averages gradients across ranks before each step. Link chorus::chorus_torch.
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/elastic.h"

namespace chorus::torch_api {

// Maps a torch dtype to chorus's; throws InvalidArgument for unsupported ones.
DataType toChorus(c10::ScalarType t);

// Collectives on the default runtime. CPU tensors are used in place; others are
// staged through a contiguous CPU copy.
torch::Tensor allreduce(const torch::Tensor& t, const AllreduceOptions& opts = {});
void allreduce_(torch::Tensor& t, const AllreduceOptions& opts = {});
std::vector<torch::Tensor> groupedAllreduce(const std::vector<torch::Tensor>& ts, const AllreduceOptions& opts = {});
torch::Tensor allgather(const torch::Tensor& t, const OpOptions& opts = {});
torch::Tensor broadcast(const torch::Tensor& t, int rootRank, const OpOptions& opts = {});
void broadcast_(torch::Tensor& t, int rootRank, const OpOptions& opts = {});
// Returns the output and the rows received from each rank.
std::pair<torch::Tensor, std::vector<int64_t>> alltoall(const torch::Tensor& t, const std::vector<int64_t>& splits = {},
                                                        const OpOptions& opts = {});
torch::Tensor reducescatter(const torch::Tensor& t, const ReducescatterOptions& opts = {});

// Makes every rank's parameters (and buffers) equal to rootRank's.
void broadcastParameters(const std::vector<std::pair<std::string, torch::Tensor>>& named, int rootRank);

// Wraps an optimizer: step() first averages every parameter's gradient across the
// process set (one fused, grouped allreduce), then steps the wrapped optimizer.
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> inner,
                       std::vector<std::pair<std::string, torch::Tensor>> namedParameters,
                       ReduceOp op = ReduceOp::kAverage, int32_t processSet = kGlobalProcessSetId);
  // Averages the gradients now (step() calls it unless it was called since the last step).
  void synchronize();
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr);
  void zero_grad();
  torch::optim::Optimizer& inner() { return *inner_; }

 private:
  std::shared_ptr<torch::optim::Optimizer> inner_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  ReduceOp op_;
  int32_t processSet_;
  bool synchronized_ = false;
};

// Elastic training (chorus/elastic.h) of a libtorch model and optimizer, as
// horovod.torch.elastic.TorchState: save() keeps copies of the parameters,
// buffers, optimizer state and the epoch/batch counters; restore() puts them
// back; sync() takes rank 0's.
class TorchState : public elastic::State {
 public:
  TorchState(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer);
  void save() override;
  void restore() override;
  void sync() override;

  int64_t epoch = 0, batch = 0;

 private:
  std::vector<std::pair<std::string, torch::Tensor>> tensors() const;  // parameters and buffers

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> saved_;
  std::string savedOptimizer_;
  int64_t savedEpoch_ = 0, savedBatch_ = 0;
};

}  // namespace chorus::torch_api
