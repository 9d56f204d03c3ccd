// Elastic libtorch training: workers may fail or join while it runs; the job
// rolls back to the last commit and goes on.
//   chorusrun --min-np 1 --max-np 4 --host-discovery-script examples/elastic/discover_local.sh
//       ./build/train_torch_elastic [result.json]
// Rank r's batch at step s is drawn from seed 1000 s + r, so a run's result can be
// checked against a fault-free replay of its committed schedule of world sizes,
// which rank 0 writes with the final parameters to result.json. STEPS sets the
// length; FAULT=kill:WORKER:STEP kills that worker mid-step (for the tests).
#include <chorus/torch.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace ct = chorus::torch_api;

// TorchState plus what this program commits of its own: the world size of every step.
struct RunState : ct::TorchState {
  using ct::TorchState::TorchState;
  std::vector<int64_t> sizes, savedSizes;
  void save() override {
    ct::TorchState::save();
    savedSizes = sizes;
  }
  void restore() override {
    ct::TorchState::restore();
    sizes = savedSizes;
  }
  void sync() override {
    ct::TorchState::sync();
    int64_t n = static_cast<int64_t>(sizes.size());
    rt_.broadcast(chorus::Tensor{&n, chorus::DataType::kInt64, {1}}, 0);
    sizes.resize(static_cast<size_t>(n));
    if (n) rt_.broadcast(chorus::Tensor{sizes.data(), chorus::DataType::kInt64, {n}}, 0);
    savedSizes = sizes;
  }
};

int main(int argc, char** argv) {
  chorus::init();
  const int steps = std::getenv("STEPS") ? std::atoi(std::getenv("STEPS")) : 30;
  const std::string me = std::getenv("CHORUS_ELASTIC_WORKER") ? std::getenv("CHORUS_ELASTIC_WORKER") : "";
  const std::string fault = std::getenv("FAULT") ? std::getenv("FAULT") : "";
  torch::manual_seed(0);
  auto net = std::make_shared<torch::nn::LinearImpl>(4, 1);
  net->to(torch::kFloat64);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  ct::DistributedOptimizer opt(sgd, named);
  RunState state(net, sgd);
  state.registerResetCallback([&] {
    std::printf("worker %s: reset, now rank %d of %d\n", me.c_str(), chorus::rank(), chorus::size());
    std::fflush(stdout);
  });

  chorus::elastic::run(chorus::defaultRuntime(), state, [&](chorus::elastic::State&) {
    const int rank = chorus::rank(), size = chorus::size();
    if (rank == 0) std::printf("resuming from commit %lld with %d ranks\n", static_cast<long long>(state.batch), size);
    std::fflush(stdout);
    while (state.batch < steps) {
      auto gen = at::detail::createCPUGenerator(1000 * state.batch + rank);
      auto x = torch::randn({8, 4}, gen, torch::kFloat64);
      auto y = x.sum(1, true) * 0.5 + 1.0;
      opt.zero_grad();
      auto loss = (net->forward(x) - y).pow(2).mean();
      loss.backward();
      if (fault == "kill:" + me + ":" + std::to_string(state.batch)) kill(getpid(), SIGKILL);
      opt.step();
      state.sizes.push_back(size);
      ++state.batch;
      if (rank == 0) std::printf("step %lld size %d loss %.6f\n", static_cast<long long>(state.batch), size,
                                 loss.item<double>());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      state.commit();
    }
  });

  if (chorus::rank() == 0 && argc > 1) {  // the schedule and the parameters, written atomically
    const std::string path = argv[1], tmp = path + ".tmp";
    std::ofstream out(tmp);
    out << "{\"sizes\": [";
    for (size_t i = 0; i < state.sizes.size(); ++i) out << (i ? ", " : "") << state.sizes[i];
    out << "], \"params\": [";
    int k = 0;
    for (const auto& p : net->parameters()) {
      auto flat = p.detach().flatten();
      out << (k++ ? ", " : "") << "[";
      for (int64_t i = 0; i < flat.numel(); ++i) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.17g", flat[i].item<double>());
        out << (i ? ", " : "") << buf;
      }
      out << "]";
    }
    out << "]}\n";
    out.close();
    std::rename(tmp.c_str(), path.c_str());
  }
  std::printf("worker %s: done as rank %d of %d\n", me.c_str(), chorus::rank(), chorus::size());
  chorus::shutdown();
  return 0;
}
