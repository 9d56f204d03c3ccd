// Adasum allreduce: every rank gets the same adaptive sum of all ranks'
// tensors, tensor by tensor even when fused. The expected values come from the
// definition, computed here in float64 by recursion (split at the largest power
// of two below n, as a binary tree over the ranks pairs them).
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"

namespace chorus::testing {
namespace {

using Vec = std::vector<double>;

Vec combine(const Vec& a, const Vec& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa >= 1e-8 ? 1 - dot / (2 * aa) : 1, cb = bb >= 1e-8 ? 1 - dot / (2 * bb) : 1;
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

Vec adasum(const std::vector<Vec>& v, size_t lo, size_t hi) {
  if (hi - lo == 1) return v[lo];
  size_t half = 1;
  while (half * 2 < hi - lo) half *= 2;
  return combine(adasum(v, lo, lo + half), adasum(v, lo + half, hi));
}

// Rank r's tensor t: correlated across ranks (a shared part) with a part of
// its own, so the coefficients are neither 1 nor 1/2.
double value(int rank, int tensor, int64_t i) {
  return std::sin(0.37 * i + tensor) + 0.5 * std::cos(1.3 * i * (rank + 1) + 0.1 * tensor) + 0.25 * rank;
}

class Adasum : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  ConfigTweak transport() const {
    const std::string t = std::get<1>(GetParam());
    if (t == "hier")
      return [](Config& c) {
        c.hostname = c.rank % 2 ? "hostB" : "hostA";
        c.hierarchicalAllreduce = 1;
      };
    return [t](Config& c) { c.cpuOperations = t; };
  }
};

TEST_P(Adasum, FusedTensorsCombineOneByOne) {
  const int n = ranks();
  const std::vector<int64_t> counts = {1, 7, 1031, 40000};
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      for (int round = 0; round < 2; ++round) {  // the second from the response cache
        std::vector<HostBuffer> in, out;
        std::vector<Work> works;
        for (size_t t = 0; t < counts.size(); ++t) {
          in.emplace_back(dt, Shape{counts[t]});
          out.emplace_back(dt, Shape{counts[t]});
        }
        for (size_t t = 0; t < counts.size(); ++t) {
          for (int64_t i = 0; i < counts[t]; ++i) in[t].set(i, value(c.rank, static_cast<int>(t), i));
          AllreduceOptions o;
          o.op = ReduceOp::kAdasum;
          o.name = "adasum." + std::string(dtypeName(dt)) + "." + std::to_string(t);
          works.push_back(c.rt.allreduceAsync(in[t].tensor(), out[t].tensor(), o));
        }
        for (size_t t = 0; t < counts.size(); ++t) {
          works[t].wait();
          std::vector<Vec> all(n, Vec(counts[t]));
          for (int r = 0; r < n; ++r)
            for (int64_t i = 0; i < counts[t]; ++i) all[r][i] = representable(dt, value(r, static_cast<int>(t), i));
          const Vec want = adasum(all, 0, n);
          // Half precision rounds the coefficients' inputs: a looser bound.
          const double tol = dt == DataType::kFloat64 ? 1e-12 : dt == DataType::kFloat32 ? 1e-5 : 2e-2;
          for (int64_t i = 0; i < counts[t]; ++i)
            ASSERT_NEAR(out[t].get(i), want[i], tol * (1 + std::fabs(want[i])))
                << dtypeName(dt) << " tensor " << t << " element " << i << " rank " << c.rank;
        }
      }
    }
  }, transport());
}

TEST_P(Adasum, OrthogonalAddsEqualKeeps) {
  const int n = ranks();
  if (n != 2 && n != 4) GTEST_SKIP();
  runRanksOk(n, [&](RankContext& c) {
    // Orthogonal: rank r holds a one-hot vector; Adasum is their sum.
    HostBuffer e(DataType::kFloat64, {4});
    for (int i = 0; i < 4; ++i) e.set(i, i == c.rank ? 3.0 : 0.0);
    AllreduceOptions o;
    o.op = ReduceOp::kAdasum;
    c.rt.allreduce(e.tensor(), e.tensor(), o);
    for (int i = 0; i < 4; ++i) ASSERT_DOUBLE_EQ(e.get(i), i < n ? 3.0 : 0.0);
    // Equal on every rank: Adasum is that vector (Sum would be n times it).
    HostBuffer s(DataType::kFloat32, {3});
    for (int i = 0; i < 3; ++i) s.set(i, i + 1.0);
    c.rt.allreduce(s.tensor(), s.tensor(), o);
    for (int i = 0; i < 3; ++i) ASSERT_NEAR(s.get(i), i + 1.0, 1e-6);
  }, transport());
}

TEST_P(Adasum, JoinedRankCountsAsZeros) {
  const int n = ranks();
  if (n < 2) GTEST_SKIP();
  runRanksOk(n, [&](RankContext& c) {
    if (c.rank != 0) {
      HostBuffer b(DataType::kFloat32, {5});
      for (int i = 0; i < 5; ++i) b.set(i, value(c.rank, 0, i));
      AllreduceOptions o;
      o.op = ReduceOp::kAdasum;
      o.name = "adasum.joined";
      c.rt.allreduce(b.tensor(), b.tensor(), o);
      std::vector<Vec> all(n, Vec(5, 0.0));
      for (int r = 1; r < n; ++r)
        for (int i = 0; i < 5; ++i) all[r][i] = representable(DataType::kFloat32, value(r, 0, i));
      const Vec want = adasum(all, 0, n);
      for (int i = 0; i < 5; ++i) ASSERT_NEAR(b.get(i), want[i], 1e-5 * (1 + std::fabs(want[i])));
    }
    c.rt.join();
  }, transport());
}

TEST(AdasumErrors, IntegersAndReducescatterRefused) {
  runRanksOk(2, [&](RankContext& c) {
    HostBuffer i(DataType::kInt32, {3});
    AllreduceOptions o;
    o.op = ReduceOp::kAdasum;
    try {
      c.rt.allreduce(i.tensor(), i.tensor(), o);
      ADD_FAILURE() << "an integer Adasum ran";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("floating"), std::string::npos) << e.what();
    }
    ReducescatterOptions r;
    r.op = ReduceOp::kAdasum;
    HostBuffer f(DataType::kFloat32, {4});
    EXPECT_THROW(c.rt.reducescatter(f.tensor(), r), InvalidArgument);
    // Usable afterwards.
    o.op = ReduceOp::kSum;
    HostBuffer one(DataType::kFloat32, {1});
    one.set(0, 1);
    c.rt.allreduce(one.tensor(), one.tensor(), o);
    EXPECT_EQ(one.get(0), 2.0);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Adasum,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("shm", "tcp", "hier")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace chorus::testing
