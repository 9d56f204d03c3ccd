// chorus's device logic through the device interface's host stand-in: ready
// events, staging, fusion of device tensors, completion, errors and the choice
// of path. The stand-in's streams are threads, so ordering bugs show up as
// wrong values. These are not GPU tests (tests/gpu runs the same on a GPU).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "chorus/error.h"
#include "comm/communicator.h"
#include "comm/device_path.h"
#include "device/host_stand_in.h"
#include "device_helpers.h"
#include "reduce/half.h"
#include "reduce/cpu_optimizer.h"
#include "harness.h"

namespace chorus::testing {
namespace {

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kProduct};

TEST(DeviceStandIn, KernelsMatchTheCpuReference) {
  auto b = makeHostStandIn();
  void* s = b->createStream(0);
  const size_t n = 1000;
  std::vector<float> a(n), c(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 17) - 8.0f;
    c[i] = static_cast<float>(i % 5) * 0.5f;
  }
  float* da = static_cast<float*>(b->allocDevice(0, n * 4));
  float* dc = static_cast<float*>(b->allocDevice(0, n * 4));
  b->copy(da, a.data(), n * 4, s);
  b->copy(dc, c.data(), n * 4, s);
  b->reduce(DataType::kFloat32, ReduceOp::kMax, da, dc, n, s);
  b->scale(DataType::kFloat32, da, da, n, 0.25, s);
  std::vector<float> out(n);
  b->copy(out.data(), da, n * 4, s);
  b->synchronizeStream(s);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], std::max(a[i], c[i]) * 0.25f) << i;
  int32_t ints[3] = {7, -7, 9};
  void* di = b->allocDevice(0, sizeof ints);
  b->copy(di, ints, sizeof ints, s);
  b->divide(DataType::kInt32, di, 3, 2, s);
  b->copy(ints, di, sizeof ints, s);
  b->synchronizeStream(s);
  EXPECT_EQ(ints[0], 3);
  EXPECT_EQ(ints[1], -4);  // rounds down, as torch's floor_divide and Horovod's integer average
  EXPECT_EQ(ints[2], 4);
  EXPECT_EQ(b->deviceOf(da + 10), 0);
  EXPECT_EQ(b->deviceOf(a.data()), -1);
  b->freeDevice(da);
  b->freeDevice(dc);
  b->freeDevice(di);
  b->destroyStream(s);
}

// The device optimizer's interface through the stand-in against torch's AdamW
// formula worked in double here: many tensors in one call, bfloat16 gradients
// and 16-bit copies, a sum of squares added into device memory.
TEST(DeviceStandIn, AdamOverManyTensorsFollowsTorchsFormula) {
  auto b = makeHostStandIn();
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.99f, eps = 1e-8f, wd = 0.05f, gs = 0.25f;
  const int64_t step = 4;
  AdamHyper h{lr, b1, b2, eps, wd, true, step, gs};
  const AdamCoefficients c = adamCoefficients(h);
  std::vector<size_t> sizes = {1, 17, 1000, 4099};
  std::vector<std::vector<float>> p, m, v;
  std::vector<std::vector<uint16_t>> g, low;
  std::vector<OptimTensor> ts;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    p.emplace_back(n), m.emplace_back(n), v.emplace_back(n), g.emplace_back(n), low.emplace_back(n);
    for (size_t i = 0; i < n; ++i) {
      p[k][i] = std::sin(0.1f * i + k);
      m[k][i] = 0.01f * std::cos(0.3f * i);
      v[k][i] = 0.001f * (1 + (i % 7));
      g[k][i] = floatToBf16(std::cos(0.7f * i + k));
    }
  }
  auto p0 = p, m0 = m, v0 = v;
  // Kernels reach device memory: each array goes up, and comes back after.
  std::vector<std::vector<void*>> dev(sizes.size());
  auto up = [&](const void* src, size_t bytes) {
    void* d = b->allocDevice(0, bytes);
    b->copy(d, src, bytes, nullptr);
    return d;
  };
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    dev[k] = {up(p[k].data(), n * 4), up(m[k].data(), n * 4), up(v[k].data(), n * 4), up(g[k].data(), n * 2),
              up(low[k].data(), n * 2)};
    ts.push_back({static_cast<float*>(dev[k][0]), static_cast<float*>(dev[k][1]), static_cast<float*>(dev[k][2]),
                  dev[k][3], dev[k][4], n});
  }
  b->adam(c, DataType::kBFloat16, DataType::kBFloat16, ts.data(), ts.size(), nullptr);
  std::vector<uint16_t> half(1000);
  for (size_t i = 0; i < half.size(); ++i) half[i] = floatToHalf(0.01f * i);
  double sum = 1.0;  // (added to)
  void* dh = up(half.data(), half.size() * 2);
  void* ds = up(&sum, 8);
  b->sumSquares(DataType::kFloat16, dh, half.size(), static_cast<double*>(ds), nullptr);
  EXPECT_THROW(b->sumSquares(DataType::kFloat16, half.data(), half.size(), static_cast<double*>(ds), nullptr), Error)
      << "a kernel reached pageable host memory";
  for (size_t k = 0; k < sizes.size(); ++k) {
    b->copy(p[k].data(), dev[k][0], sizes[k] * 4, nullptr);
    b->copy(m[k].data(), dev[k][1], sizes[k] * 4, nullptr);
    b->copy(low[k].data(), dev[k][4], sizes[k] * 2, nullptr);
  }
  b->copy(&sum, ds, 8, nullptr);
  b->synchronizeStream(nullptr);
  for (auto& d : dev)
    for (void* q : d) b->freeDevice(q);
  b->freeDevice(dh);
  b->freeDevice(ds);
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (size_t i = 0; i < sizes[k]; ++i) {
      const double grad = static_cast<double>(bf16ToFloat(g[k][i])) * gs;
      const double mi = b1 * static_cast<double>(m0[k][i]) + (1 - b1) * grad;
      const double vi = b2 * static_cast<double>(v0[k][i]) + (1 - b2) * grad * grad;
      const double mhat = mi / (1 - std::pow(b1, step)), vhat = vi / (1 - std::pow(b2, step));
      const double want = p0[k][i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
      ASSERT_NEAR(p[k][i], want, 1e-5 * (1 + std::abs(want))) << k << " " << i;
      ASSERT_NEAR(m[k][i], mi, 1e-6) << k << " " << i;
      ASSERT_NEAR(bf16ToFloat(low[k][i]), want, 1e-2 * (1 + std::abs(want))) << k << " " << i;
    }
  }
  double want = 1.0;
  for (uint16_t x : half) want += static_cast<double>(halfToFloat(x)) * halfToFloat(x);
  EXPECT_NEAR(sum, want, 1e-5 * want);  // (float sums within blocks, as on the GPU)
}

TEST(DeviceStandIn, AStreamWaitsForAnEventRecordedElsewhere) {
  auto b = makeHostStandIn();
  void* producer = b->createStream(0);
  void* consumer = b->createStream(0);
  void* e = b->createEvent(0);
  std::atomic<int> value{0};
  int seen = -1;
  standInEnqueue(*b, producer, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 42;
  });
  b->record(e, producer);
  b->streamWait(consumer, e);
  standInEnqueue(*b, consumer, [&] { seen = value; });
  b->synchronizeStream(consumer);
  EXPECT_EQ(seen, 42);
  b->destroyEvent(e);
  b->destroyStream(producer);
  b->destroyStream(consumer);
}

// Every dtype and op on 1-4 ranks sharing a "GPU": staged through host memory
// in 4 KiB chunks (several per op), fused, each input written late on a stream
// of the caller's (the ready event is what makes chorus read the right data).
class DeviceCollectives : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCollectives, AllreduceEveryDtypeAndOpWaitsForReadyData) {
  const int n = GetParam();
  auto dev = makeHostStandIn();
  runRanksOk(n, [&](RankContext& c) {
    void* stream = dev->createStream(0);
    for (DataType dt : kAllDtypes) {
      for (ReduceOp op : kOps) {
        const std::vector<int64_t> counts = {1, 7, 3001};
        std::vector<std::unique_ptr<DevBuf>> in, out;
        std::vector<Tensor> ins, outs;
        for (int64_t count : counts) {
          in.push_back(std::make_unique<DevBuf>(*dev, dt, Shape{count}));
          out.push_back(std::make_unique<DevBuf>(*dev, dt, Shape{count}));
          for (int64_t i = 0; i < count; ++i) in.back()->host().set(i, testValue(c.rank, i, dt, op));
          in.back()->upload(stream, std::chrono::milliseconds(2));
          ins.push_back(in.back()->tensor());
          outs.push_back(out.back()->tensor());
        }
        AllreduceOptions o;
        o.op = op;
        o.stream = stream;
        Work w = c.rt.groupedAllreduceAsync(ins, outs, o);
        w.wait();
        w.streamWait(stream);
        dev->synchronizeStream(stream);
        for (size_t k = 0; k < counts.size(); ++k)
          for (int64_t i = 0; i < counts[k]; ++i) {
            const double want = reference(op, dt, n, i);
            ASSERT_NEAR(out[k]->read(i), want, tolerance(dt, want))
                << dtypeName(dt) << " " << reduceOpName(op) << " tensor " << k << " element " << i;
          }
      }
    }
    EXPECT_EQ(c.rt.stats().gpuPath, "STAGED");
    dev->destroyStream(stream);
  }, withDevice(dev));
}

TEST_P(DeviceCollectives, ScaledAllreduceInPlaceAndOneTensor) {
  const int n = GetParam();
  auto dev = makeHostStandIn();
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt32}) {
      DevBuf buf(*dev, dt, Shape{5000});
      for (int64_t i = 0; i < 5000; ++i) buf.host().set(i, testValue(c.rank, i, dt, ReduceOp::kSum));
      buf.upload(nullptr);
      AllreduceOptions o;
      o.op = ReduceOp::kAverage;
      o.prescaleFactor = 2.0;
      o.postscaleFactor = 1.5;
      Work w = c.rt.allreduceAsync(buf.tensor(), buf.tensor(), o);
      w.wait();
      w.synchronizeDevice();  // (the host waits for chorus's device work itself)
      for (int64_t i = 0; i < 5000; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += testValue(r, i, dt, ReduceOp::kSum) * 2.0;
        // Integers: the postscale truncates, then Average's division rounds down.
        const double want = dt == DataType::kInt32 ? std::floor(std::trunc(sum * 1.5) / n) : sum * 1.5 / n;
        ASSERT_NEAR(buf.read(i), want, tolerance(dt, want) + (dt == DataType::kBFloat16 ? 0.05 : 0))
            << dtypeName(dt) << " element " << i;
      }
    }
  }, withDevice(dev));
}

TEST_P(DeviceCollectives, AllgatherBroadcastAlltoallReducescatter) {
  const int n = GetParam();
  auto dev = makeHostStandIn();
  runRanksOk(n, [&](RankContext& c) {
    const DataType dt = DataType::kFloat64;
    // allgather: rank r gives r + 1 rows of 3.
    DevBuf mine(*dev, dt, Shape{c.rank + 1, 3});
    for (int64_t i = 0; i < (c.rank + 1) * 3; ++i) mine.host().set(i, c.rank * 100 + i);
    mine.upload(nullptr, std::chrono::milliseconds(5));
    Work g = c.rt.allgather(mine.tensor());
    hostSees(g, *dev);
    const Tensor& all = g.output();
    ASSERT_EQ(all.device, 0);
    int64_t at = 0;
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < (r + 1) * 3; ++i, ++at) ASSERT_EQ(readAs(standInHostAddress(*dev, all.data), dt, at), r * 100 + i);
    // broadcast from the last rank.
    DevBuf b(*dev, dt, Shape{777});
    for (int64_t i = 0; i < 777; ++i) b.host().set(i, c.rank == n - 1 ? i * 0.5 : -1);
    b.upload(nullptr);
    Work bw = c.rt.broadcastAsync(b.tensor(), b.tensor(), n - 1);
    hostSees(bw, *dev);
    for (int64_t i = 0; i < 777; ++i) ASSERT_EQ(b.read(i), i * 0.5) << "rank " << c.rank << " element " << i;
    // alltoall: rank r sends j + 1 rows to rank j, valued 1000 r + j.
    int64_t rows = 0;
    std::vector<int64_t> splits;
    for (int j = 0; j < n; ++j) {
      splits.push_back(j + 1);
      rows += j + 1;
    }
    DevBuf a(*dev, dt, Shape{rows, 2});
    int64_t k = 0;
    for (int j = 0; j < n; ++j)
      for (int64_t q = 0; q < (j + 1) * 2; ++q) a.host().set(k++, 1000 * c.rank + j);
    a.upload(nullptr);
    Work aw = c.rt.alltoall(a.tensor(), splits);
    hostSees(aw, *dev);
    ASSERT_EQ(aw.output().shape[0], static_cast<int64_t>(n) * (c.rank + 1));
    for (int r = 0; r < n; ++r)
      for (int64_t q = 0; q < (c.rank + 1) * 2; ++q)
        ASSERT_EQ(readAs(standInHostAddress(*dev, aw.output().data), dt, r * (c.rank + 1) * 2 + q), 1000 * r + c.rank);
    // reducescatter of 2n + 1 rows (uneven: the first rank gets one more).
    const int64_t total = 2 * n + 1;
    DevBuf rs(*dev, DataType::kFloat32, Shape{total, 4});
    for (int64_t i = 0; i < total * 4; ++i) rs.host().set(i, c.rank + i);
    rs.upload(nullptr);
    ReducescatterOptions ro;
    ro.op = ReduceOp::kSum;
    Work rw = c.rt.reducescatter(rs.tensor(), ro);
    hostSees(rw, *dev);
    const int64_t myRows = total / n + (c.rank < total % n ? 1 : 0);
    int64_t first = 0;
    for (int r = 0; r < c.rank; ++r) first += total / n + (r < total % n ? 1 : 0);
    ASSERT_EQ(rw.output().shape[0], myRows);
    for (int64_t i = 0; i < myRows * 4; ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += r + first * 4 + i;
      ASSERT_EQ(readAs(standInHostAddress(*dev, rw.output().data), DataType::kFloat32, i), want);
    }
  }, withDevice(dev));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCollectives, ::testing::Values(1, 2, 3, 4));

TEST(DeviceCollectives, HostTensorOnOneRankAndDeviceOnAnotherIsAMismatch) {
  auto dev = makeHostStandIn();
  auto errors = runRanks(2, [&](RankContext& c) {
    std::vector<float> host(16, 1.0f);
    DevBuf d(*dev, DataType::kFloat32, Shape{16});
    Tensor t = c.rank == 0 ? Tensor{host.data(), DataType::kFloat32, {16}} : d.tensor();
    AllreduceOptions o;
    o.name = "grad";
    try {
      c.rt.allreduce(t, t, o);
      FAIL() << "no error";
    } catch (const Mismatch& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("device"), std::string::npos) << m;
      EXPECT_NE(m.find("cpu on ranks [0]"), std::string::npos) << m;
      EXPECT_NE(m.find("cuda:0 on ranks [1]"), std::string::npos) << m;
    }
    // The runtime stays usable.
    std::vector<float> ok(4, static_cast<float>(c.rank));
    c.rt.allreduce(Tensor{ok.data(), DataType::kFloat32, {4}}, Tensor{ok.data(), DataType::kFloat32, {4}});
    EXPECT_EQ(ok[0], 0.5f);
  }, withDevice(dev));
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(DeviceCollectives, JoinedRankTakesPartWithZeros) {
  auto dev = makeHostStandIn();
  runRanksOk(3, [&](RankContext& c) {
    if (c.rank == 2) {
      c.rt.join();
      return;
    }
    DevBuf d(*dev, DataType::kFloat32, Shape{9000});
    for (int64_t i = 0; i < 9000; ++i) d.host().set(i, c.rank + 1);
    d.upload(nullptr);
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    Work w = c.rt.allreduceAsync(d.tensor(), d.tensor(), o);
    hostSees(w, *dev);
    for (int64_t i = 0; i < 9000; ++i) ASSERT_EQ(d.read(i), 3.0) << i;  // 1 + 2 + 0
    c.rt.join();
  }, withDevice(dev));
}

TEST(DeviceCollectives, ProcessSetsEachChooseTheirPath) {
  auto dev = makeHostStandIn();
  runRanksOk(4, [&](RankContext& c) {
    ProcessSet odd = c.rt.addProcessSet({1, 3});
    if (odd.included()) {
      DevBuf d(*dev, DataType::kFloat32, Shape{100});
      for (int64_t i = 0; i < 100; ++i) d.host().set(i, c.rank * i);
      d.upload(nullptr);
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.processSet = odd.id();
      Work w = c.rt.allreduceAsync(d.tensor(), d.tensor(), o);
      hostSees(w, *dev);
      for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(d.read(i), 4.0 * i);
      EXPECT_EQ(c.rt.stats(odd.id()).gpuPath, "STAGED");
      EXPECT_NE(c.rt.stats(odd.id()).gpuPathReason.find("share GPU"), std::string::npos)
          << c.rt.stats(odd.id()).gpuPathReason;
    }
    EXPECT_EQ(c.rt.stats().gpuPath, "");  // the global set ran no device op
    c.rt.barrier();
    c.rt.removeProcessSet(odd.id());
  }, [&](Config& c) {
    withDevice(dev)(c);
    c.dynamicProcessSets = true;
  });
}

TEST(DeviceCollectives, NcclAskedForOnASharedGpuIsAClearError) {
  auto dev = makeHostStandIn();
  auto errors = runRanks(2, [&](RankContext& c) {
    DevBuf d(*dev, DataType::kFloat32, Shape{8});
    c.rt.allreduce(d.tensor(), d.tensor());
  }, withDevice(dev, "nccl"));
  for (const auto& e : errors) {
    EXPECT_NE(e.find("CHORUS_GPU_OPERATIONS=nccl cannot be met"), std::string::npos) << e;
    EXPECT_NE(e.find("share GPU standin:0"), std::string::npos) << e;
  }
}

TEST(DeviceCollectives, HostStagingWhenAskedEvenWithGpusOfTheirOwn) {
  runRanksOk(2, [&](RankContext& c) {
    DevBuf d(*c.rt.config().device, DataType::kFloat32, Shape{8});
    for (int64_t i = 0; i < 8; ++i) d.host().set(i, 1);
    d.upload(nullptr);
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    c.rt.allreduce(d.tensor(), d.tensor(), o);
    c.rt.config().device->synchronizeStream(nullptr);
    EXPECT_EQ(c.rt.stats().gpuPath, "STAGED");
    EXPECT_NE(c.rt.stats().gpuPathReason.find("asks for host staging"), std::string::npos);
  }, [](Config& c) {
    HostStandInOptions o;
    o.identityPrefix = "gpu-of-rank-" + std::to_string(c.rank) + ":";
    withDevice(makeHostStandIn(o), "host")(c);
  });
}

TEST(DeviceCollectives, OneCallsTensorsMustShareADeviceAndAdasumIsRefused) {
  auto dev = makeHostStandIn();
  runRanksOk(1, [&](RankContext& c) {
    DevBuf d(*dev, DataType::kFloat32, Shape{8});
    std::vector<float> h(8);
    Tensor ht{h.data(), DataType::kFloat32, {8}};
    EXPECT_THROW(c.rt.groupedAllreduceAsync({d.tensor(), ht}, {d.tensor(), ht}), InvalidArgument);
    AllreduceOptions o;
    o.op = ReduceOp::kAdasum;
    EXPECT_THROW(c.rt.allreduceAsync(d.tensor(), d.tensor(), o), InvalidArgument);
  }, withDevice(dev));
}

TEST(DeviceCollectives, TimelineNamesTheStagedPathAndFusionCopies) {
  auto dev = makeHostStandIn();
  const std::string path = ::testing::TempDir() + "/device_timeline.json";
  runRanksOk(2, [&](RankContext& c) {
    if (c.rank == 0) c.rt.startTimeline(path);
    c.rt.barrier();
    DevBuf a(*dev, DataType::kFloat32, Shape{64}), b(*dev, DataType::kFloat32, Shape{64});
    Work w = c.rt.groupedAllreduceAsync({a.tensor(), b.tensor()}, {a.tensor(), b.tensor()});
    hostSees(w, *dev);  // (before a and b are freed: chorus's copies into them may still be queued)
    c.rt.barrier();
    if (c.rank == 0) c.rt.stopTimeline();
  }, withDevice(dev));
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string trace = ss.str();
  for (const char* name : {"STAGED_ALLREDUCE", "WAIT_FOR_DATA", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"})
    EXPECT_NE(trace.find(name), std::string::npos) << name;
}

TEST(DeviceCollectives, CudaTensorWithNoGpuSaysWhatIsMissing) {
  // No device given: chorus opens its CUDA backend, which finds no GPU here
  // (on a GPU machine this test has nothing to check).
  auto errors = runRanks(1, [&](RankContext& c) {
    float dummy = 0;
    Tensor t{&dummy, DataType::kFloat32, {1}, 0};
    c.rt.allreduce(t, t);
  });
  if (errors[0].empty()) GTEST_SKIP() << "a usable GPU is present";
  EXPECT_NE(errors[0].find("CUDA"), std::string::npos) << errors[0];
}


// Horovod's hierarchical allreduce for CUDA tensors, composed of device paths
// over the set's communicators within and across hosts (two simulated hosts
// of two ranks; staged parts here, NCCL within a host on a GPU machine).
TEST(DeviceHierarchy, ReduceScatterWithinHostsAllreduceAcrossGatherBack) {
  auto dev = makeHostStandIn();
  auto store = makeMemoryStore();
  const int n = 4;
  const std::vector<std::string> hosts = {"hostA", "hostB", "hostA", "hostB"};
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions co;
        co.jobId = "devhier" + std::to_string(getpid());
        co.hierarchicalAllreduce = 1;
        co.timeoutSeconds = 20;
        auto transport = makeTransportDevice(co);
        auto comm = makeCommunicator(transport, *store, "h/", r, hosts, co);
        const HostSplit split = comm->hostSplit();
        if (!split.local || !split.cross) throw Error("the hierarchical communicator offers no host split");
        DevicePathOptions po;
        po.stageChunkBytes = 4096;
        auto path = makeHierarchicalPath(dev, 0, makeStagedPath(dev, 0, *split.local, po),
                                         makeStagedPath(dev, 0, *split.cross, po), makeStagedPath(dev, 0, *comm, po),
                                         split.local->rank(), split.local->size());
        void* s = dev->createStream(0);
        for (int64_t count : {1, 3, 4097}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAverage}) {
            DevBuf in(*dev, DataType::kFloat32, Shape{count}), out(*dev, DataType::kFloat32, Shape{count});
            for (int64_t i = 0; i < count; ++i) in.host().set(i, testValue(r, i, DataType::kFloat32, op));
            in.upload(s);
            const double scale = op == ReduceOp::kAverage ? 1.0 / n : 1.0;
            if (r == 3 && op == ReduceOp::kSum) {  // a rank that joined: zeros
              path->allreduceJoined(count, DataType::kFloat32, op, scale, s);
              dev->synchronizeStream(s);
              continue;
            }
            path->allreduce(out.tensor().data, in.tensor().data, count, DataType::kFloat32, op, scale, s);
            dev->synchronizeStream(s);
            for (int64_t i = 0; i < count; ++i) {
              double want = op == ReduceOp::kSum ? 0 : testValue(0, i, DataType::kFloat32, op);
              for (int q = 0; q < n; ++q) {
                const double v = testValue(q, i, DataType::kFloat32, op);
                if (op == ReduceOp::kSum) want += q == 3 ? 0 : v;
                else if (op == ReduceOp::kMax) want = std::max(want, v);
              }
              if (op == ReduceOp::kAverage) want = reference(ReduceOp::kAverage, DataType::kFloat32, n, i);
              if (out.read(i) != representable(DataType::kFloat32, want))
                throw Error("rank " + std::to_string(r) + " " + reduceOpName(op) + " count " + std::to_string(count) +
                            " element " + std::to_string(i) + ": " + std::to_string(out.read(i)) + " != " +
                            std::to_string(want));
            }
          }
        }
        dev->destroyStream(s);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Point-to-point of CUDA tensors travels through pinned host memory: a send is
// copied down after the caller's stream (the data is written late there), a
// receive copied up on a side stream that the caller's stream then waits for.
TEST(DeviceP2p, SendRecvAndBatchedExchangeOfDeviceTensors) {
  auto dev = makeHostStandIn();
  runRanksOk(2, [&](RankContext& c) {
    const int peer = 1 - c.rank;
    void* stream = dev->createStream(0);
    DevBuf mine(*dev, DataType::kFloat32, Shape{3000}), into(*dev, DataType::kFloat32, Shape{3000});
    for (int64_t i = 0; i < 3000; ++i) mine.host().set(i, c.rank * 10000 + i);
    mine.upload(stream, std::chrono::milliseconds(20));
    SendRecvOptions o;
    o.stream = stream;
    if (c.rank == 0) {
      c.rt.send(mine.tensor(), peer, o);
    } else {
      c.rt.recv(into.tensor(), peer, o);  // (the blocking form orders the stream itself)
      dev->synchronizeStream(stream);
      for (int64_t i = 0; i < 3000; ++i) ASSERT_EQ(into.read(i), static_cast<double>(i)) << i;
    }
    std::vector<P2pOp> ops = {P2pOp{true, mine.tensor(), peer, 7}, P2pOp{false, into.tensor(), peer, 7}};
    for (Work& w : c.rt.batchSendRecvAsync(ops, kGlobalProcessSetId, stream)) {
      w.wait();
      w.streamWait(stream);
    }
    dev->synchronizeStream(stream);
    for (int64_t i = 0; i < 3000; ++i) ASSERT_EQ(into.read(i), peer * 10000.0 + i) << i;
    dev->destroyStream(stream);
  }, withDevice(dev));
}

}  // namespace
}  // namespace chorus::testing
