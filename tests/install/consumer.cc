#include <chorus/chorus.h>

#include <cstdio>

int main() {
  chorus::init();
  int v = chorus::rank() + 1;
  chorus::AllreduceOptions o;
  o.op = chorus::ReduceOp::kSum;
  chorus::defaultRuntime().allreduce(chorus::Tensor{&v, chorus::DataType::kInt32, {1}},
                                     chorus::Tensor{&v, chorus::DataType::kInt32, {1}}, o);
  const int n = chorus::size();
  std::printf("sum %d\n", v);
  chorus::shutdown();
  return v == n * (n + 1) / 2 ? 0 : 1;
}
