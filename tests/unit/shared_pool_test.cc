// Outputs chorus allocates (and allocateShared's buffers) come from a pool of
// memfd-backed buffers; a shared-memory allgather or allreduce whose outputs all
// come from it writes straight into every output.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/shm/shared_pool.h"
#include "harness.h"

namespace chorus::testing {
namespace {

void shm(Config& c) { c.cpuOperations = "shm"; }
// The fused op in one piece, as the counts of peer maps below assume (chunked,
// each chunk chooses its own path; see Preemption.*).
void shmWhole(Config& c) {
  shm(c);
  c.preemptChunkBytes = 0;
}

TEST(SharedPool, DescribesOnlyRangesInsideALiveBuffer) {
  auto pool = SharedPool::instance();
  auto buf = pool->allocate(3 << 20);
  ASSERT_TRUE(buf);
  char* p = static_cast<char*>(buf.get());
  SharedBufferRef ref;
  ASSERT_TRUE(pool->describe(p + 100, 1000, &ref));
  EXPECT_EQ(ref.offset, 100u);
  EXPECT_GE(ref.bytes, size_t{3} << 20);
  EXPECT_FALSE(pool->describe(p + ref.bytes - 10, 11, &ref));  // runs past the end
  int onStack = 0;
  EXPECT_FALSE(pool->describe(&onStack, sizeof onStack, &ref));
}

// Counted from what the free list holds just after the free, so that buffers
// earlier tests of this process left there (or dropped) do not matter; a size
// no other test uses, so that no older free buffer of that size is handed out.
TEST(SharedPool, AFreedBufferIsHandedOutAgainWithoutAFreshMapping) {
  auto pool = SharedPool::instance();
  const size_t bytes = (13 << 20) + 12345;
  void* first;
  uint64_t firstId;
  size_t whole;
  {
    auto buf = pool->allocate(bytes);
    ASSERT_TRUE(buf);
    first = buf.get();
    SharedBufferRef ref;
    ASSERT_TRUE(pool->describe(first, 1, &ref));
    firstId = ref.id;
    whole = ref.bytes;
    ASSERT_GE(whole, bytes);
    std::memset(first, 7, bytes);
  }
  const size_t held = pool->cachedBytes();
  EXPECT_GE(held, whole);  // kept, not unmapped
  auto again = pool->allocate(bytes);
  SharedBufferRef ref;
  ASSERT_TRUE(pool->describe(again.get(), 1, &ref));
  EXPECT_EQ(ref.id, firstId);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->cachedBytes(), held - whole);
}

TEST(SharedPool, APeerMappingSeesTheOwnersBytes) {
  auto pool = SharedPool::instance();
  auto buf = pool->allocate(2 << 20);
  ASSERT_TRUE(buf);
  char* p = static_cast<char*>(buf.get());
  SharedBufferRef ref;
  ASSERT_TRUE(pool->describe(p + 4096, 8, &ref));
  auto peer = pool->mapPeer(ref);
  ASSERT_TRUE(peer);
  EXPECT_NE(peer.get(), p);  // another mapping of the same pages
  std::memcpy(peer.get() + ref.offset, "written", 8);
  EXPECT_STREQ(p + 4096, "written");
  p[0] = 42;
  EXPECT_EQ(peer.get()[0], 42);
  SharedBufferRef bogus = ref;
  bogus.fd = 1 << 20;  // no such descriptor
  bogus.id = ~uint64_t{0};
  EXPECT_FALSE(pool->mapPeer(bogus));
}

// Allgathers of over 1 MiB in all with uneven rows, chorus allocating the
// outputs: every rank maps every other's output, and the results are exact,
// step after step (buffers are reused: stale data would show).
TEST(SharedPool, AllgatherWritesStraightIntoChorusAllocatedOutputs) {
  for (int n : {2, 3, 4}) {
    const uint64_t handed = SharedPool::instance()->peerMapsHanded();
    const int steps = 3;
    const std::vector<DataType> dtypes = {DataType::kFloat32, DataType::kFloat16, DataType::kInt64};
    uint64_t direct = 0;  // ops of 1 MiB or more in all, on every rank
    for (DataType dt : dtypes) {
      int64_t rowsInAll = 0;
      for (int k = 0; k < n; ++k) rowsInAll += 70001 + 313 * k;
      if (rowsInAll * 2 * static_cast<int64_t>(dtypeSize(dt)) >= int64_t{1} << 20) direct += steps * n;
    }
    ASSERT_GE(direct, static_cast<uint64_t>(2 * steps * n));  // float16 is below it for 2 and 3 ranks
    runRanksOk(n, [&](RankContext& c) {
      for (DataType dt : dtypes) {
        for (int step = 0; step < steps; ++step) {
          const int64_t rows = 70001 + 313 * c.rank;  // uneven, not a multiple of 64 bytes
          HostBuffer in(dt, {rows, 2});
          for (int64_t i = 0; i < 2 * rows; ++i) in.set(i, testValue(c.rank, i + step, dt, ReduceOp::kSum));
          OpOptions o;
          o.name = std::string("direct.") + dtypeName(dt);
          Work w = c.rt.allgather(in.tensor(), o);
          const Tensor& out = w.output();
          int64_t at = 0;
          for (int k = 0; k < n; ++k) {
            for (int64_t i = 0; i < 2 * (70001 + 313 * k); ++i, ++at) {
              ASSERT_EQ(readAs(out.data, dt, at), testValue(k, i + step, dt, ReduceOp::kSum))
                  << "n " << n << " " << dtypeName(dt) << " step " << step << " from rank " << k << " element " << i;
            }
          }
          EXPECT_EQ(at, numElements(out.shape));
        }
      }
    }, shm);
    // Each rank mapped each other rank's output once per op.
    EXPECT_EQ(SharedPool::instance()->peerMapsHanded() - handed, direct * (n - 1)) << n << " ranks";
  }
}

// One rank gives its own output buffer: every rank falls back to the slots
// together, with the same results.
TEST(SharedPool, APrivateOutputOnOneRankSendsEveryRankThroughTheSlots) {
  const int n = 3;
  const uint64_t handed = SharedPool::instance()->peerMapsHanded();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t rows = 300000;
    std::vector<float> in(rows), own(rows * n);
    for (int64_t i = 0; i < rows; ++i) in[i] = static_cast<float>(c.rank * rows + i);
    Allocator mine = [&](const Shape&, DataType) -> void* { return own.data(); };
    for (int step = 0; step < 2; ++step) {
      Work w = c.rt.allgather(Tensor{in.data(), DataType::kFloat32, {rows}}, {}, c.rank == 1 ? mine : nullptr);
      const float* got = static_cast<const float*>(w.output().data);
      if (c.rank == 1) {
        ASSERT_EQ(got, own.data());
      }
      for (int64_t i = 0; i < rows * n; ++i) ASSERT_EQ(got[i], static_cast<float>(i)) << "element " << i;
    }
  }, shm);
  EXPECT_EQ(SharedPool::instance()->peerMapsHanded(), handed);
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

// Allreduces of over 1 MiB whose outputs come from allocateShared: every rank
// maps every other's output, the results match a float64 reference in and out
// of place, step after step (the pool hands the same buffers out again, so stale
// data would show), and every rank ends up with the same bits.
TEST(SharedPool, AllreduceWritesStraightIntoSharedOutputs) {
  struct Case {
    DataType dt;
    ReduceOp op;
  };
  const std::vector<Case> cases = {{DataType::kFloat32, ReduceOp::kSum},    {DataType::kBFloat16, ReduceOp::kSum},
                                   {DataType::kInt32, ReduceOp::kMax},      {DataType::kFloat64, ReduceOp::kProduct},
                                   {DataType::kFloat32, ReduceOp::kAverage}, {DataType::kInt64, ReduceOp::kMin}};
  const int steps = 2;
  for (int n : {2, 3, 4}) {
    const uint64_t handed = SharedPool::instance()->peerMapsHanded();
    std::vector<std::vector<uint64_t>> bits(n);
    runRanksOk(n, [&](RankContext& c) {
      for (const Case& k : cases) {
        const size_t es = dtypeSize(k.dt);
        const int64_t count = static_cast<int64_t>((1 << 20) / es) + 4099;  // odd, split unevenly
        for (bool inPlace : {false, true}) {
          for (int step = 0; step < steps; ++step) {
            HostBuffer in(k.dt, {count});
            for (int64_t i = 0; i < count; ++i) in.set(i, testValue(c.rank, i + step, k.dt, k.op));
            auto out = allocateShared(count * es);
            Tensor o{out.get(), k.dt, {count}};
            if (inPlace) std::memcpy(out.get(), in.tensor().data, count * es);
            AllreduceOptions opts;
            opts.op = k.op;
            opts.name = std::string("direct.") + dtypeName(k.dt) + (inPlace ? ".inplace" : "");
            c.rt.allreduce(inPlace ? o : in.tensor(), o, opts);
            for (int64_t i = 0; i < count; ++i) {
              const double want = reference(k.op, k.dt, n, i + step);
              ASSERT_NEAR(readAs(out.get(), k.dt, i), want, tolerance(k.dt, want))
                  << n << " ranks " << dtypeName(k.dt) << (inPlace ? " in place" : "") << " step " << step
                  << " element " << i;
            }
          }
        }
      }
      // Sums whose rounding depends on the order of the ranks.
      const int64_t count = 400009;
      std::vector<float> in(count);
      for (int64_t i = 0; i < count; ++i) in[i] = (c.rank + 1) / 3.0f + static_cast<float>(i % 1000) * 1e-3f;
      auto out = allocateShared(count * 4);
      AllreduceOptions sum;
      sum.op = ReduceOp::kSum;
      c.rt.allreduce(Tensor{in.data(), DataType::kFloat32, {count}}, Tensor{out.get(), DataType::kFloat32, {count}}, sum);
      const float* got = static_cast<const float*>(out.get());
      for (int64_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += (r + 1) / 3.0f + static_cast<float>(i % 1000) * 1e-3f;
        ASSERT_NEAR(got[i], want, 1e-5 * want) << "element " << i;
      }
      bits[c.rank].push_back(fnv1a(got, count * 4));
    }, shm);
    const uint64_t ops = cases.size() * 2 * steps + 1;
    EXPECT_EQ(SharedPool::instance()->peerMapsHanded() - handed, ops * n * (n - 1)) << n << " ranks";
    for (int r = 1; r < n; ++r) EXPECT_EQ(bits[r], bits[0]) << "rank " << r << " of " << n;
  }
}

// A grouped allreduce (one fused op) whose outputs all come from allocateShared
// and are 1 MiB or more: every tensor is mapped, in or out of place, an empty
// one among them. With a smaller tensor in the group the whole op takes the
// slots, and the results are the same.
TEST(SharedPool, FusedAllreduceOfSharedOutputsWritesStraightIntoEach) {
  const int n = 3;
  const std::vector<int64_t> counts = {(1 << 20) / 4 + 17, 0, (2 << 20) / 4 + 3, (1 << 20) / 4};
  for (bool withSmall : {false, true}) {
    const uint64_t handed = SharedPool::instance()->peerMapsHanded();
    runRanksOk(n, [&](RankContext& c) {
      for (int step = 0; step < 2; ++step) {
        std::vector<HostBuffer> ins;
        std::vector<std::shared_ptr<void>> outs;
        std::vector<Tensor> in, out;
        std::vector<int64_t> sizes = counts;
        if (withSmall) sizes.push_back(1000);
        int64_t base = 0;
        for (size_t t = 0; t < sizes.size(); ++t) {
          ins.emplace_back(DataType::kFloat32, Shape{sizes[t]});
          for (int64_t i = 0; i < sizes[t]; ++i)
            ins.back().set(i, testValue(c.rank, base + i + step, DataType::kFloat32, ReduceOp::kSum));
          base += sizes[t];
          outs.push_back(allocateShared(std::max<int64_t>(sizes[t], 1) * 4));
          out.push_back(Tensor{outs.back().get(), DataType::kFloat32, {sizes[t]}});
          if (t == 2) {  // in place
            std::memcpy(outs.back().get(), ins.back().tensor().data, sizes[t] * 4);
            in.push_back(out.back());
          } else {
            in.push_back(ins.back().tensor());
          }
        }
        AllreduceOptions sum;
        sum.op = ReduceOp::kSum;
        sum.name = "fused.direct";
        c.rt.groupedAllreduceAsync(in, out, sum).wait();
        base = 0;
        for (size_t t = 0; t < sizes.size(); ++t) {
          for (int64_t i = 0; i < sizes[t]; ++i) {
            const double want = reference(ReduceOp::kSum, DataType::kFloat32, n, base + i + step);
            ASSERT_NEAR(readAs(outs[t].get(), DataType::kFloat32, i), want, tolerance(DataType::kFloat32, want))
                << "tensor " << t << " element " << i << " step " << step;
          }
          base += sizes[t];
        }
      }
    }, shmWhole);
    const uint64_t mapped = withSmall ? 0 : 2 * 3 * n * (n - 1);  // 2 steps, 3 non-empty tensors
    EXPECT_EQ(SharedPool::instance()->peerMapsHanded() - handed, mapped) << (withSmall ? "with" : "without") << " a small tensor";
  }
}

// One rank reduces into a private buffer: every rank takes the slots together.
TEST(SharedPool, APrivateAllreduceOutputOnOneRankSendsEveryRankThroughTheSlots) {
  const int n = 3;
  const uint64_t handed = SharedPool::instance()->peerMapsHanded();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t count = 700001;
    std::vector<float> in(count), own(count);
    for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>(c.rank * 1000 + i % 977);
    auto shared = allocateShared(count * 4);
    float* out = c.rank == 1 ? own.data() : static_cast<float*>(shared.get());
    AllreduceOptions sum;
    sum.op = ReduceOp::kSum;
    c.rt.allreduce(Tensor{in.data(), DataType::kFloat32, {count}}, Tensor{out, DataType::kFloat32, {count}}, sum);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<float>(3000 + 3 * (i % 977))) << "element " << i;
  }, shm);
  EXPECT_EQ(SharedPool::instance()->peerMapsHanded(), handed);
}

// Reducescatters of over 1 MiB whose inputs come from allocateShared: each rank
// reads its piece from every rank's input, mapped; the pieces (uneven rows, a
// rank with none) match a float64 reference step after step, and the inputs are
// left as they were.
TEST(SharedPool, ReducescatterReadsSharedInputsStraight) {
  struct Case {
    DataType dt;
    ReduceOp op;
    int64_t rowElems;
  };
  // Horovod's reducescatter takes Sum and Average.
  const std::vector<Case> cases = {{DataType::kFloat32, ReduceOp::kSum, 1},     {DataType::kBFloat16, ReduceOp::kSum, 3},
                                   {DataType::kInt32, ReduceOp::kSum, 7},       {DataType::kFloat64, ReduceOp::kAverage, 1},
                                   {DataType::kFloat32, ReduceOp::kAverage, 5}, {DataType::kInt64, ReduceOp::kSum, 2},
                                   {DataType::kFloat16, ReduceOp::kAverage, 4}};
  const int steps = 2;
  for (int n : {2, 3, 4}) {
    const uint64_t handed = SharedPool::instance()->peerMapsHanded();
    runRanksOk(n, [&](RankContext& c) {
      for (const Case& k : cases) {
        const size_t es = dtypeSize(k.dt);
        const int64_t rows = static_cast<int64_t>((3 << 20) / es / k.rowElems) + n - 1;  // rows % n != 0
        const int64_t count = rows * k.rowElems;
        for (int step = 0; step < steps; ++step) {
          HostBuffer values(k.dt, {count});
          for (int64_t i = 0; i < count; ++i) values.set(i, testValue(c.rank, i + step, k.dt, k.op));
          auto in = allocateShared(count * es);
          std::memcpy(in.get(), values.tensor().data, count * es);
          ReducescatterOptions opts;
          opts.op = k.op;
          opts.name = std::string("rs.direct.") + dtypeName(k.dt);
          Work w = c.rt.reducescatter(Tensor{in.get(), k.dt, {rows, k.rowElems}}, opts);
          w.wait();
          int64_t first = 0;  // Horovod's split: the first rows % n ranks get a row more
          for (int r = 0; r < c.rank; ++r) first += rows / n + (r < rows % n ? 1 : 0);
          const int64_t mine = rows / n + (c.rank < rows % n ? 1 : 0);
          ASSERT_EQ(w.output(0).shape, (Shape{mine, k.rowElems}));
          for (int64_t i = 0; i < mine * k.rowElems; ++i) {
            const double want = reference(k.op, k.dt, n, first * k.rowElems + i + step);
            ASSERT_NEAR(readAs(w.output(0).data, k.dt, i), want, tolerance(k.dt, want))
                << n << " ranks " << dtypeName(k.dt) << " step " << step << " element " << i;
          }
          ASSERT_EQ(std::memcmp(values.tensor().data, in.get(), count * es), 0) << "the input changed";
        }
      }
    }, shm);
    EXPECT_EQ(SharedPool::instance()->peerMapsHanded() - handed, cases.size() * steps * n * (n - 1)) << n << " ranks";
  }
}

// One rank's input is private: every rank takes the slots together.
TEST(SharedPool, APrivateReducescatterInputOnOneRankSendsEveryRankThroughTheSlots) {
  const int n = 3;
  const uint64_t handed = SharedPool::instance()->peerMapsHanded();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t count = 900003;
    std::vector<float> own(count);
    auto shared = allocateShared(count * 4);
    float* in = c.rank == 2 ? own.data() : static_cast<float*>(shared.get());
    for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>(c.rank * 1000 + i % 977);
    ReducescatterOptions sum;
    sum.op = ReduceOp::kSum;
    Work w = c.rt.reducescatter(Tensor{in, DataType::kFloat32, {count}}, sum);
    w.wait();
    const int64_t first = c.rank * (count / n);
    const float* got = static_cast<const float*>(w.output(0).data);
    for (int64_t i = 0; i < count / n; ++i)
      ASSERT_EQ(got[i], static_cast<float>(3000 + 3 * ((first + i) % 977))) << "element " << i;
  }, shm);
  EXPECT_EQ(SharedPool::instance()->peerMapsHanded(), handed);
}

TEST(SharedPool, AllocateSharedIsPrivateBelowTheThreshold) {
  auto small = allocateShared(4096);
  auto large = allocateShared(SharedPool::kMinBytes);
  SharedBufferRef ref;
  ASSERT_TRUE(small && large);
  EXPECT_FALSE(SharedPool::instance()->describe(small.get(), 4096, &ref));
  EXPECT_TRUE(SharedPool::instance()->describe(large.get(), SharedPool::kMinBytes, &ref));
}

}  // namespace
}  // namespace chorus::testing
