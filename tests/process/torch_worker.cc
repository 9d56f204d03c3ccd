// The libtorch frontend's collectives, checked against values computed here.
#include <chorus/torch.h>

#include <cstdio>

namespace ct = chorus::torch_api;

#undef CHECK  // torch defines one; this worker returns instead of aborting
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond);    \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main() {
  chorus::init();
  const int r = chorus::rank(), n = chorus::size();
  chorus::AllreduceOptions sum;
  sum.op = chorus::ReduceOp::kSum;
  auto a = torch::arange(6, torch::kFloat64).reshape({2, 3}) + r;
  auto expect = torch::arange(6, torch::kFloat64).reshape({2, 3}) * n + n * (n - 1) / 2;
  CHECK(torch::equal(ct::allreduce(a, sum), expect));
  // Over 1 MiB: the output lives in shared memory the other ranks write into; it
  // stays right after later ops reuse the pool.
  auto big = [&](int step) { return torch::arange(300007, torch::kFloat32) * (r + 1) + step; };
  auto bigExpect = [&](int step) { return torch::arange(300007, torch::kFloat32) * (n * (n + 1) / 2) + step * n; };
  auto first = ct::allreduce(big(0), sum);
  for (int step = 1; step < 3; ++step) CHECK(torch::equal(ct::allreduce(big(step), sum), bigExpect(step)));
  CHECK(torch::equal(first, bigExpect(0)));
  auto nc = a.t();  // not contiguous: staged, and copied back in place
  ct::allreduce_(nc, sum);
  CHECK(torch::equal(nc, expect.t()));
  auto g = ct::allgather(torch::full({r + 1, 2}, r, torch::kInt32));
  CHECK(g.size(0) == n * (n + 1) / 2 && g[g.size(0) - 1][0].item<int>() == n - 1);
  auto b = ct::broadcast(torch::full({3}, r * 2.0), n - 1);
  CHECK(b[0].item<double>() == (n - 1) * 2.0);
  auto [out, received] = ct::alltoall(torch::arange(2 * n, torch::kInt64) + 100 * r);
  CHECK(received == std::vector<int64_t>(n, 2));
  CHECK(out[2 * (n - 1)].item<int64_t>() == 100 * (n - 1) + 2 * r);
  auto rs = ct::reducescatter(torch::ones({2 * n + 1, 2}, torch::kFloat32), chorus::ReducescatterOptions{});
  CHECK(rs.size(0) == 2 + (r < 1 ? 1 : 0) && rs[0][0].item<float>() == 1.0f);
  auto i16 = ct::allreduce(torch::full({2}, r + 1, torch::kInt16), sum);
  CHECK(i16.scalar_type() == torch::kInt16 && i16[1].item<int>() == n * (n + 1) / 2);
  bool threw = false;
  try {
    ct::allreduce(torch::ones({2}, torch::kComplexFloat));
  } catch (const chorus::InvalidArgument&) {
    threw = true;
  }
  CHECK(threw);
  std::printf("rank %d torch frontend ok\n", r);
  chorus::shutdown();
  return 0;
}
