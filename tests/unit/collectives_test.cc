// The collective matrix: every op, dtype and reduce op, on 1-4 ranks, with
// element counts 0, 1, odd and large. Expected values are computed here in
// float64 (or exact integer arithmetic) from the same generator the ranks use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "harness.h"

namespace chorus::testing {
namespace {

// Parameters: number of ranks, and the data path: "shm", "tcp", or "hier"
// (hierarchical: two simulated hosts).
class Collectives : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  ConfigTweak transport() const {
    std::string t = std::get<1>(GetParam());
    if (t == "hier") {
      // Two simulated hosts, ranks interleaved (0,2,.. on one; 1,3,.. on the other).
      return [](Config& c) {
        c.hostname = c.rank % 2 ? "hostB" : "hostA";
        c.hierarchicalAllreduce = c.hierarchicalAllgather = 1;
      };
    }
    if (t == "shm_staged") {  // shared memory without the single-copy paths
      return [](Config& c) {
        c.cpuOperations = "shm";
        c.shmSingleCopy = false;
      };
    }
    if (t == "shm_memory") {  // large ops' slots written past the caches
      return [](Config& c) {
        c.cpuOperations = "shm";
        c.shmPeerPath = "memory";
      };
    }
    return [t](Config& c) { c.cpuOperations = t; };
  }
};

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kProduct};
// 20011: 20-160 KiB fused with the others, past the size reduced whole.
const std::vector<int64_t> kCounts = {0, 1, 7, 1031, 20011};

TEST_P(Collectives, AllreduceEveryDtypeOpAndSize) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : kAllDtypes) {
      for (ReduceOp op : kOps) {
        // All sizes in flight at once: they negotiate and fuse together.
        std::vector<HostBuffer> in, out;
        for (int64_t count : kCounts) {
          in.emplace_back(dt, Shape{count});
          out.emplace_back(dt, Shape{count});
          for (int64_t i = 0; i < count; ++i) in.back().set(i, testValue(c.rank, i, dt, op));
        }
        std::vector<Work> works;
        for (size_t k = 0; k < kCounts.size(); ++k) {
          AllreduceOptions o;
          o.op = op;
          o.name = std::string("ar.") + dtypeName(dt) + "." + reduceOpName(op) + "." + std::to_string(k);
          works.push_back(c.rt.allreduceAsync(in[k].tensor(), out[k].tensor(), o));
        }
        for (auto& w : works) w.wait();
        for (size_t k = 0; k < kCounts.size(); ++k) {
          for (int64_t i = 0; i < kCounts[k]; ++i) {
            double want = reference(op, dt, n, i);
            ASSERT_NEAR(out[k].get(i), want, tolerance(dt, want))
                << dtypeName(dt) << " " << reduceOpName(op) << " count " << kCounts[k] << " i " << i;
            // Out of place: the input is read, never written.
            ASSERT_EQ(in[k].get(i), testValue(c.rank, i, dt, op)) << dtypeName(dt) << " input " << i;
          }
        }
      }
    }
  }, transport());
}

// The float at `off` bytes past the first cache-line boundary inside mem.
float* lineAt(std::vector<char>& mem, size_t off) {
  return reinterpret_cast<float*>(((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63}) + off);
}

// Each rank's buffers sit at their own offsets within a cache line, inputs and
// outputs apart (a shared-memory slot's data follows its owner's input): every
// element right and inputs untouched, in place or not, alone and fused, over
// several slot rounds.
TEST_P(Collectives, AllreduceFromBuffersAtDifferentLineOffsets) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    auto value = [&](int64_t i, size_t k) {
      return static_cast<float>(testValue(c.rank, i + static_cast<int64_t>(k), DataType::kFloat32, ReduceOp::kSum));
    };
    for (bool inPlace : {false, true}) {
      for (const std::vector<int64_t>& counts : {std::vector<int64_t>{300001}, std::vector<int64_t>{70001, 300001}}) {
        std::vector<std::vector<char>> inMem, outMem;
        std::vector<Tensor> ins, outs;
        for (size_t k = 0; k < counts.size(); ++k) {
          inMem.emplace_back(counts[k] * 4 + 128);
          outMem.emplace_back(counts[k] * 4 + 128);
          float* in = lineAt(inMem.back(), (4 + 12 * c.rank + 8 * k) % 64);
          float* out = inPlace ? in : lineAt(outMem.back(), (8 + 20 * c.rank) % 64);
          for (int64_t i = 0; i < counts[k]; ++i) in[i] = value(i, k);
          ins.push_back(Tensor{in, DataType::kFloat32, {counts[k]}});
          outs.push_back(Tensor{out, DataType::kFloat32, {counts[k]}});
        }
        AllreduceOptions o;
        o.op = ReduceOp::kSum;
        o.name = std::string("offsets.") + (inPlace ? "in" : "out") + std::to_string(counts.size());
        if (counts.size() == 1) c.rt.allreduce(ins[0], outs[0], o);
        else c.rt.groupedAllreduceAsync(ins, outs, o).wait();
        for (size_t k = 0; k < counts.size(); ++k) {
          const auto* out = static_cast<const float*>(outs[k].data);
          const auto* in = static_cast<const float*>(ins[k].data);
          for (int64_t i = 0; i < counts[k]; ++i) {
            const double want = reference(ReduceOp::kSum, DataType::kFloat32, n, i + static_cast<int64_t>(k));
            ASSERT_NEAR(out[i], want, tolerance(DataType::kFloat32, want)) << k << " " << i;
            if (!inPlace) {
              ASSERT_EQ(in[i], value(i, k)) << k << " " << i;
            }
          }
        }
      }
    }
  }, transport());
}

TEST_P(Collectives, AllreduceLargeInPlaceWithScaling) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t count = 300001;  // several transport segments, odd
    HostBuffer buf(DataType::kFloat32, {count});
    for (int64_t i = 0; i < count; ++i) buf.set(i, testValue(c.rank, i, DataType::kFloat32, ReduceOp::kSum));
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    o.prescaleFactor = 0.5;
    o.postscaleFactor = 3.0;
    c.rt.allreduce(buf.tensor(), buf.tensor(), o);
    for (int64_t i = 0; i < count; i += 997) {
      double want = reference(ReduceOp::kSum, DataType::kFloat32, n, i) * 1.5;
      ASSERT_NEAR(buf.get(i), want, 1e-5) << i;
    }
  }, transport());
}

// A fused float32 sum of tensors of these sizes (tensor k holds testValue at
// i + k), each in place where inPlace(k): results right, separate inputs
// untouched; every element checked where every, else a spread of them.
template <typename InPlace>
void checkGroupedSum(RankContext& c, int n, const std::vector<int64_t>& counts, InPlace inPlace, bool every) {
  std::vector<HostBuffer> in, out;
  std::vector<Tensor> ins, outs;
  auto value = [&](int64_t i, size_t k) {
    return testValue(c.rank, i + static_cast<int64_t>(k), DataType::kFloat32, ReduceOp::kSum);
  };
  for (size_t k = 0; k < counts.size(); ++k) {
    in.emplace_back(DataType::kFloat32, Shape{counts[k]});
    out.emplace_back(DataType::kFloat32, Shape{counts[k]});
    for (int64_t i = 0; i < counts[k]; ++i) in.back().set(i, value(i, k));
  }
  for (size_t k = 0; k < counts.size(); ++k) {
    ins.push_back(in[k].tensor());
    outs.push_back(inPlace(k) ? in[k].tensor() : out[k].tensor());
  }
  AllreduceOptions o;
  o.op = ReduceOp::kSum;
  c.rt.groupedAllreduceAsync(ins, outs, o).wait();
  for (size_t k = 0; k < counts.size(); ++k) {
    const HostBuffer& result = inPlace(k) ? in[k] : out[k];
    for (int64_t i = 0; i < counts[k]; i += every ? 1 : (i % 7) + 1) {
      const double want = reference(ReduceOp::kSum, DataType::kFloat32, n, i + static_cast<int64_t>(k));
      ASSERT_NEAR(result.get(i), want, tolerance(DataType::kFloat32, want)) << k << " " << i;
      if (!inPlace(k)) {
        ASSERT_EQ(in[k].get(i), value(i, k)) << k << " " << i;
      }
    }
  }
}

// Fused, out of place, large enough for many transport chunks and for the
// streamed-output path: outputs right, inputs untouched.
TEST_P(Collectives, LargeGroupedAllreduceOutOfPlace) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    checkGroupedSum(c, n, {1500001, 5, 700003}, [](size_t) { return false; }, false);
  }, transport());
}

// Medium sizes (past the whole-reduce size, below the streamed size) fused with
// in-place and separate outputs side by side: each output gets its own store
// kind (separate ones are streamed), at offsets that are not line-aligned.
TEST_P(Collectives, MediumFusedAllreduceMixingInPlaceAndSeparateOutputs) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    checkGroupedSum(c, n, {9001, 3, 40013, 17}, [](size_t k) { return k % 2 == 1; }, true);
  }, transport());
}

TEST_P(Collectives, GroupedAllreduceCompletesTogether) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    std::vector<HostBuffer> bufs;
    std::vector<Tensor> ts;
    for (int k = 0; k < 5; ++k) {
      bufs.emplace_back(DataType::kFloat64, Shape{k + 1, 3});
      for (int64_t i = 0; i < (k + 1) * 3; ++i) bufs.back().set(i, testValue(c.rank, i + k, DataType::kFloat64, ReduceOp::kSum));
    }
    for (auto& b : bufs) ts.push_back(b.tensor());
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    Work w = c.rt.groupedAllreduceAsync(ts, ts, o);
    w.wait();
    for (int k = 0; k < 5; ++k)
      for (int64_t i = 0; i < (k + 1) * 3; ++i)
        ASSERT_DOUBLE_EQ(bufs[k].get(i), reference(ReduceOp::kSum, DataType::kFloat64, n, i + k));
  }, transport());
}

TEST_P(Collectives, AllgatherUnevenFirstDimension) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : kAllDtypes) {
      // Rank r contributes r rows (rank 0: none) of 3 columns.
      const int64_t rows = c.rank;
      HostBuffer in(dt, {rows, 3});
      for (int64_t i = 0; i < rows * 3; ++i) in.set(i, testValue(c.rank, i, dt, ReduceOp::kSum));
      OpOptions o;
      o.name = std::string("ag.") + dtypeName(dt);
      Work w = c.rt.allgather(in.tensor(), o);
      const Tensor& out = w.output();
      int64_t total = 0;
      for (int r = 0; r < n; ++r) total += r;
      ASSERT_EQ(out.shape, (Shape{total, 3}));
      int64_t off = 0;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < r * 3; ++i)
          ASSERT_EQ(readAs(out.data, dt, off + i), representable(dt, testValue(r, i, dt, ReduceOp::kSum)))
              << dtypeName(dt) << " from rank " << r;
        off += r * 3;
      }
    }
  }, transport());
}

// Allgather into the caller's output, each rank's input and output at their own
// offsets within a cache line, pieces of uneven sizes over several slot rounds.
TEST_P(Collectives, AllgatherFromBuffersAtDifferentLineOffsets) {
  const int n = ranks();
  auto rows = [](int r) { return int64_t{300001} + 99991 * r; };
  runRanksOk(n, [&](RankContext& c) {
    int64_t total = 0;
    for (int r = 0; r < n; ++r) total += rows(r);
    std::vector<char> inMem(rows(c.rank) * 4 + 128), outMem(total * 4 + 128);
    float* in = lineAt(inMem, (4 + 12 * c.rank) % 64);
    float* out = lineAt(outMem, (8 + 20 * c.rank) % 64);
    for (int64_t i = 0; i < rows(c.rank); ++i) in[i] = static_cast<float>(testValue(c.rank, i, DataType::kFloat32, ReduceOp::kSum));
    OpOptions o;
    o.name = "ag.offsets";
    Work w = c.rt.allgather(Tensor{in, DataType::kFloat32, {rows(c.rank)}}, o,
                            [out](const Shape&, DataType) -> void* { return out; });
    ASSERT_EQ(w.output().data, out);
    int64_t off = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < rows(r); ++i)
        ASSERT_EQ(out[off + i], static_cast<float>(testValue(r, i, DataType::kFloat32, ReduceOp::kSum))) << r << " " << i;
      off += rows(r);
    }
  }, transport());
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : kAllDtypes) {
      for (int root = 0; root < n; ++root) {
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1031}}) {
          HostBuffer buf(dt, {count});
          for (int64_t i = 0; i < count; ++i) buf.set(i, testValue(c.rank, i, dt, ReduceOp::kSum));
          OpOptions o;
          o.name = "bc." + std::to_string(root) + "." + std::to_string(count);
          c.rt.broadcast(buf.tensor(), root, o);
          for (int64_t i = 0; i < count; ++i)
            ASSERT_EQ(buf.get(i), representable(dt, testValue(root, i, dt, ReduceOp::kSum)))
                << dtypeName(dt) << " root " << root;
        }
      }
    }
  }, transport());
}

TEST_P(Collectives, AlltoallWithSplits) {
  const int n = ranks();
  // Every self-piece is one row; other pieces 0-2 rows.
  auto split = [](int src, int dst) { return static_cast<int64_t>((src + 2 * dst + 1) % 3); };
  runRanksOk(n, [&](RankContext& c) {
    // Narrow rows, then rows wide enough for several slot rounds and streamed outputs.
    for (int64_t cols : {int64_t{2}, int64_t{150001}})
    for (DataType dt : {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16, DataType::kUInt8}) {
      if (cols > 2 && (dt == DataType::kInt64 || dt == DataType::kBFloat16)) continue;
      std::vector<int64_t> splits(n);
      int64_t rows = 0;
      for (int j = 0; j < n; ++j) rows += splits[j] = split(c.rank, j);
      HostBuffer in(dt, {rows, cols});
      for (int64_t i = 0; i < rows * cols; ++i) in.set(i, testValue(c.rank, i, dt, ReduceOp::kSum));
      Work w = c.rt.alltoall(in.tensor(), splits);
      std::vector<int64_t> wantSplits(n);
      int64_t recvRows = 0;
      for (int j = 0; j < n; ++j) recvRows += wantSplits[j] = split(j, c.rank);
      ASSERT_EQ(w.receivedSplits(), wantSplits);
      ASSERT_EQ(w.output().shape, (Shape{recvRows, cols}));
      int64_t off = 0;
      for (int j = 0; j < n; ++j) {
        int64_t srcOff = 0;  // where rank j's rows for me start in j's input
        for (int k = 0; k < c.rank; ++k) srcOff += split(j, k);
        for (int64_t i = 0; i < wantSplits[j] * cols; ++i) {
          ASSERT_EQ(readAs(w.output().data, dt, off + i),
                    representable(dt, testValue(j, srcOff * cols + i, dt, ReduceOp::kSum)))
              << "from " << j << " cols " << cols;
        }
        off += wantSplits[j] * cols;
      }
    }
  }, transport());
}

TEST_P(Collectives, ReducescatterSplitsAsHorovod) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{n + 1}, int64_t{2 * n + 3}}) {
          HostBuffer in(dt, {rows, 3});
          for (int64_t i = 0; i < rows * 3; ++i) in.set(i, testValue(c.rank, i, dt, op));
          ReducescatterOptions o;
          o.op = op;
          Work w = c.rt.reducescatter(in.tensor(), o);
          // The first rows % n ranks get one extra row.
          int64_t myRows = rows / n + (c.rank < rows % n ? 1 : 0);
          int64_t start = 0;
          for (int r = 0; r < c.rank; ++r) start += rows / n + (r < rows % n ? 1 : 0);
          ASSERT_EQ(w.output().shape, (Shape{myRows, 3}));
          for (int64_t i = 0; i < myRows * 3; ++i) {
            double want = reference(op, dt, n, start * 3 + i);
            ASSERT_NEAR(readAs(w.output().data, dt, i), want, tolerance(dt, want))
                << dtypeName(dt) << " rows " << rows;
          }
        }
      }
    }
  }, transport());
}

// Each rank's input at its own offset within a cache line, pieces that start
// at odd offsets (7 columns), several slot rounds per piece.
TEST_P(Collectives, ReducescatterFromBuffersAtDifferentLineOffsets) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t rows = 60001 * n + n - 1, cols = 7;
    std::vector<char> mem(rows * cols * 4 + 128);
    float* in = lineAt(mem, (4 + 12 * c.rank) % 64);
    for (int64_t i = 0; i < rows * cols; ++i) in[i] = static_cast<float>(testValue(c.rank, i, DataType::kFloat32, ReduceOp::kSum));
    ReducescatterOptions o;
    o.op = ReduceOp::kSum;
    Work w = c.rt.reducescatter(Tensor{in, DataType::kFloat32, {rows, cols}}, o);
    const int64_t myRows = rows / n + (c.rank < rows % n ? 1 : 0);
    int64_t start = 0;
    for (int r = 0; r < c.rank; ++r) start += rows / n + (r < rows % n ? 1 : 0);
    ASSERT_EQ(w.output().shape, (Shape{myRows, cols}));
    const auto* out = static_cast<const float*>(w.output().data);
    for (int64_t i = 0; i < myRows * cols; ++i) {
      const double want = reference(ReduceOp::kSum, DataType::kFloat32, n, start * cols + i);
      ASSERT_NEAR(out[i], want, tolerance(DataType::kFloat32, want)) << i;
    }
  }, transport());
}

// Pieces of over 8 MiB per rank (streamed output), an odd row count;
// the input is read, never written.
TEST_P(Collectives, LargeReducescatterLeavesInput) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    const int64_t rows = int64_t{2100001} * n + 1;
    HostBuffer in(DataType::kFloat32, {rows});
    for (int64_t i = 0; i < rows; ++i) in.set(i, testValue(c.rank, i, DataType::kFloat32, ReduceOp::kSum));
    ReducescatterOptions o;
    o.op = ReduceOp::kSum;
    Work w = c.rt.reducescatter(in.tensor(), o);
    const int64_t myRows = rows / n + (c.rank < rows % n ? 1 : 0);
    int64_t start = 0;
    for (int r = 0; r < c.rank; ++r) start += rows / n + (r < rows % n ? 1 : 0);
    ASSERT_EQ(w.output().shape, (Shape{myRows}));
    for (int64_t i = 0; i < myRows; i += (i % 13) + 1) {
      const double want = reference(ReduceOp::kSum, DataType::kFloat32, n, start + i);
      ASSERT_NEAR(readAs(w.output().data, DataType::kFloat32, i), want, tolerance(DataType::kFloat32, want)) << i;
    }
    for (int64_t i = 0; i < rows; i += 101)
      ASSERT_EQ(in.get(i), testValue(c.rank, i, DataType::kFloat32, ReduceOp::kSum)) << i;
  }, transport());
}

TEST_P(Collectives, BarrierAndJoin) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    c.rt.barrier();
    // Ranks run out of data at different steps: rank r does r+1 steps, then joins.
    // A joined rank contributes zeros to the others' allreduces.
    for (int step = 0; step <= c.rank; ++step) {
      HostBuffer b(DataType::kFloat32, {4});
      for (int i = 0; i < 4; ++i) b.set(i, 1.0);
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.name = "step." + std::to_string(step);
      c.rt.allreduce(b.tensor(), b.tensor(), o);
      // Ranks still active at this step: those with rank >= step.
      ASSERT_EQ(b.get(0), static_cast<double>(n - step)) << "step " << step;
    }
    int last = c.rt.join();
    EXPECT_EQ(last, n - 1);
    c.rt.barrier();
  }, transport());
}

TEST_P(Collectives, JoinedRanksStandInOrRefuseAsHorovod) {
  const int n = ranks();
  if (n < 2) GTEST_SKIP();
  runRanksOk(n, [&](RankContext& c) {
    // Rank 0 is out of data at once; the others run every kind of op meanwhile.
    if (c.rank != 0) {
      OpOptions o;
      // Allgather and broadcast are refused while a rank has joined, as Horovod
      // refuses them: an error on every rank that asked, and the runtime goes on.
      o.name = "joined.allgather";
      HostBuffer g(DataType::kInt32, {c.rank, 2});
      try {
        c.rt.allgather(g.tensor(), o);
        ADD_FAILURE() << "an allgather ran while a rank had joined";
      } catch (const Refused& e) {
        EXPECT_NE(std::string(e.what()).find("Allgather is not supported with Join"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ranks [0] have joined"), std::string::npos) << e.what();
      }
      o.name = "joined.broadcast";
      HostBuffer b(DataType::kFloat32, {3});
      for (int i = 0; i < 3; ++i) b.set(i, c.rank);
      try {
        c.rt.broadcast(b.tensor(), n - 1, o);
        ADD_FAILURE() << "a broadcast ran while a rank had joined";
      } catch (const Refused& e) {
        EXPECT_NE(std::string(e.what()).find("Broadcast is not supported with Join"), std::string::npos) << e.what();
      }

      o.name = "joined.alltoall";  // one row to every rank; rank 0 sends none
      HostBuffer a(DataType::kInt64, {n});
      for (int k = 0; k < n; ++k) a.set(k, 100 * c.rank + k);
      Work t = c.rt.alltoall(a.tensor(), std::vector<int64_t>(n, 1), o);
      ASSERT_EQ(t.output().shape, (Shape{n - 1}));
      for (int j = 1; j < n; ++j) ASSERT_EQ(readAs(t.output().data, DataType::kInt64, j - 1), 100 * j + c.rank);
      ASSERT_EQ(t.receivedSplits()[0], 0);

      ReducescatterOptions ro;  // rank 0 adds zeros; Average divides by every rank
      ro.name = "joined.reducescatter";
      HostBuffer x(DataType::kFloat64, {2 * n});
      for (int64_t i = 0; i < 2 * n; ++i) x.set(i, 1.0);
      Work s = c.rt.reducescatter(x.tensor(), ro);
      ASSERT_EQ(s.output().shape, (Shape{2}));
      ASSERT_DOUBLE_EQ(readAs(s.output().data, DataType::kFloat64, 1), static_cast<double>(n - 1) / n);

    }
    const int last = c.rt.join();  // rank 0 joined first: the others' ops waited for it
    EXPECT_GE(last, 1);
    EXPECT_LT(last, n);
    // Every rank afterwards: the runtime is usable.
    HostBuffer one(DataType::kInt32, {1});
    one.set(0, c.rank);
    OpOptions o;
    o.name = "after.join";
    Work w = c.rt.allgather(one.tensor(), o);
    for (int r = 0; r < n; ++r) ASSERT_EQ(readAs(w.output().data, DataType::kInt32, r), r);
  }, transport());
}

// Sizes on both sides of the direct path's size (outputs in the shared pool)
// and of the sizes whose outputs are streamed.
TEST_P(Collectives, LargeAllgatherAndBroadcast) {
  const int n = ranks();
  runRanksOk(n, [&](RankContext& c) {
    // 320 KB and more of float64 per rank, uneven; then over 8 MiB in all.
    for (int64_t base : {int64_t{40000}, int64_t{1100000} / n}) {
      const int64_t rows = base + 7 * c.rank;
      HostBuffer in(DataType::kFloat64, {rows});
      for (int64_t i = 0; i < rows; ++i) in.set(i, c.rank * 1e7 + i);
      Work w = c.rt.allgather(in.tensor());
      int64_t off = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t theirs = base + 7 * r;
        for (int64_t i = 0; i < theirs; i += 997)
          ASSERT_EQ(readAs(w.output().data, DataType::kFloat64, off + i), r * 1e7 + i) << base;
        ASSERT_EQ(readAs(w.output().data, DataType::kFloat64, off + theirs - 1), r * 1e7 + theirs - 1) << base;
        off += theirs;
      }
      ASSERT_EQ(w.output().shape[0], off);
    }
    for (int64_t count : {int64_t{100003}, int64_t{2100001}}) {
      HostBuffer b(DataType::kFloat32, {count});
      for (int64_t i = 0; i < count; ++i) b.set(i, c.rank + i % 100);
      c.rt.broadcast(b.tensor(), n - 1);
      for (int64_t i = 0; i < count; i += 101) ASSERT_EQ(b.get(i), n - 1 + i % 100) << count;
      ASSERT_EQ(b.get(count - 1), n - 1 + (count - 1) % 100) << count;
    }
  }, transport());
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("shm", "shm_staged", "shm_memory", "tcp", "hier")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace chorus::testing
