// libtorch data-parallel training under chorusrun: an MLP regressing a smooth
// function; each rank sees its own samples, gradients are averaged.
//   chorusrun -np 2 ./build/train_torch
#include <chorus/torch.h>

#include <cstdio>

namespace ct = chorus::torch_api;

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

int main() {
  chorus::init();
  const int rank = chorus::rank(), size = chorus::size();
  torch::manual_seed(100 + rank);  // different per rank until the broadcast
  auto net = std::make_shared<Net>();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  ct::broadcastParameters(named, 0);

  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05 * size));
  ct::DistributedOptimizer opt(sgd, named);
  torch::manual_seed(rank);  // each rank its own data shard
  auto x = torch::randn({512, 8});
  auto y = torch::sin(0.3 * x.sum(1, true));  // a smooth target
  float first = 0, last = 0;
  for (int epoch = 0; epoch < 60; ++epoch) {
    opt.zero_grad();
    auto loss = torch::mse_loss(net->forward(x), y);
    loss.backward();
    opt.step();
    chorus::AllreduceOptions avg;
    avg.name = "loss";
    float l = ct::allreduce(loss.detach(), avg).item<float>();
    if (epoch == 0) first = l;
    last = l;
    if (rank == 0 && epoch % 10 == 0) std::printf("epoch %2d  loss %.4f\n", epoch, l);
  }
  // Data parallelism keeps every rank's parameters identical.
  bool same = true;
  for (auto& [name, p] : named) {
    chorus::OpOptions o;
    o.name = "check." + name;
    same = same && torch::equal(ct::broadcast(p.detach(), 0, o), p.detach());
  }
  if (rank == 0) std::printf("final loss %.4f (from %.4f)\n", last, first);
  std::printf("rank %d parameters %s rank 0's\n", rank, same ? "equal" : "DIFFER from");
  chorus::shutdown();
  return (last < first * 0.5 && same) ? 0 : 1;
}
