#include <chorus/chorus.h>
#include <chorus/torch.h>

#include <cstdio>

int main() {
  chorus::init();
  torch::Tensor t = torch::full({3}, static_cast<float>(chorus::rank() + 1));
  chorus::AllreduceOptions o;
  o.op = chorus::ReduceOp::kSum;
  chorus::torch_api::allreduce_(t, o);
  const int n = chorus::size();
  std::printf("torch sum %.1f\n", t[0].item<float>());
  chorus::shutdown();
  return t[0].item<float>() == n * (n + 1) / 2.0f ? 0 : 1;
}
