// The CUDA backend on a real GPU (tests/gpu/run.sh; never in CI, which has
// none): each kernel against a CPU reference, stream and event ordering, the
// staged path's chunk pipeline, and NCCL opened and used with one rank.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <random>
#include <vector>

#include "chorus/chorus.h"
#include "comm/nccl/nccl_api.h"
#include "device/loader.h"
#include "reduce/half.h"
#include "reduce/reduce.h"
#include "reduce/cpu_optimizer.h"
#include "reduce/cast.h"

namespace chorus {
namespace {

std::shared_ptr<DeviceBackend> gpu() {
  static std::shared_ptr<DeviceBackend> b = openCudaBackend();
  return b;
}

// Device memory filled from host bytes, read back synchronously.
struct Dev {
  explicit Dev(size_t bytes) : n(bytes), p(gpu()->allocDevice(0, bytes)) {}
  ~Dev() { gpu()->freeDevice(p); }
  void put(const void* host) {
    gpu()->copy(p, host, n, nullptr);
    gpu()->synchronizeStream(nullptr);
  }
  template <typename T>
  std::vector<T> get() {
    std::vector<T> out(n / sizeof(T));
    gpu()->copy(out.data(), p, n, nullptr);
    gpu()->synchronizeStream(nullptr);
    return out;
  }
  size_t n;
  void* p;
};

TEST(CudaBackend, OpensAndNamesTheDevice) {
  auto b = gpu();
  EXPECT_STREQ(b->name(), "cuda");
  EXPECT_GE(b->count(), 1);
  EXPECT_FALSE(b->identity(0).empty());
  Dev d(64);
  EXPECT_EQ(b->deviceOf(d.p), 0);
  int host = 0;
  EXPECT_EQ(b->deviceOf(&host), -1);
  std::printf("backend: %s, device 0: %s\n", b->version().c_str(), b->identity(0).c_str());
}

TEST(CudaBackend, ReduceScaleDivideMatchTheCpuKernels) {
  const size_t n = (1 << 20) + 7;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-4, 4);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<float> a(n), c(n), want(n);
    for (size_t i = 0; i < n; ++i) a[i] = u(rng), c[i] = u(rng);
    reduceBuffers(DataType::kFloat32, op, want.data(), a.data(), c.data(), n);
    Dev da(n * 4), dc(n * 4);
    da.put(a.data());
    dc.put(c.data());
    gpu()->reduce(DataType::kFloat32, op, da.p, dc.p, n, nullptr);
    auto got = da.get<float>();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << reduceOpName(op) << " " << i;
  }
  std::vector<uint16_t> h(n);  // bfloat16, summed in float and rounded once
  std::vector<uint16_t> h2(n);
  for (size_t i = 0; i < n; ++i) h[i] = floatToBf16(u(rng)), h2[i] = floatToBf16(u(rng));
  std::vector<uint16_t> want(n);
  reduceBuffers(DataType::kBFloat16, ReduceOp::kSum, want.data(), h.data(), h2.data(), n);
  Dev dh(n * 2), dh2(n * 2);
  dh.put(h.data());
  dh2.put(h2.data());
  gpu()->reduce(DataType::kBFloat16, ReduceOp::kSum, dh.p, dh2.p, n, nullptr);
  auto got = dh.get<uint16_t>();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << i;
  std::vector<int32_t> ints = {7, -7, 9, 100, -1};
  Dev di(ints.size() * 4);
  di.put(ints.data());
  gpu()->divide(DataType::kInt32, di.p, ints.size(), 2, nullptr);
  EXPECT_EQ(di.get<int32_t>(), (std::vector<int32_t>{3, -4, 4, 50, -1}));  // rounds down, as the CPU path
  std::vector<double> d = {1.5, -2.25, 1e10};
  Dev dd(24);
  dd.put(d.data());
  gpu()->scale(DataType::kFloat64, dd.p, dd.p, 3, 0.5, nullptr);
  EXPECT_EQ(dd.get<double>(), (std::vector<double>{0.75, -1.125, 5e9}));
}

// Integers reduce in their own type and wrap (expected values worked by hand:
// through double, 2^53 + 1 + 2 would come out 2^53 + 4; uint8 would saturate).
TEST(CudaBackend, IntegersReduceInTheirOwnTypeAndWrap) {
  const int64_t big = (int64_t{1} << 53) + 1;
  std::vector<int64_t> a = {big, -5, INT64_MAX}, b = {2, 3, 1};
  Dev da(24), db(24);
  da.put(a.data());
  db.put(b.data());
  gpu()->reduce(DataType::kInt64, ReduceOp::kSum, da.p, db.p, 3, nullptr);
  EXPECT_EQ(da.get<int64_t>(), (std::vector<int64_t>{big + 2, -2, INT64_MIN}));
  std::vector<uint8_t> u = {200, 255, 7}, v = {100, 1, 9};
  Dev du(3), dv(3);
  du.put(u.data());
  dv.put(v.data());
  gpu()->reduce(DataType::kUInt8, ReduceOp::kSum, du.p, dv.p, 3, nullptr);
  EXPECT_EQ(du.get<uint8_t>(), (std::vector<uint8_t>{44, 0, 16}));
  std::vector<int8_t> s8 = {100, -100}, t8 = {100, -100};
  Dev ds(2), dt(2);
  ds.put(s8.data());
  dt.put(t8.data());
  gpu()->reduce(DataType::kInt8, ReduceOp::kSum, ds.p, dt.p, 2, nullptr);
  EXPECT_EQ(ds.get<int8_t>(), (std::vector<int8_t>{-56, 56}));
  std::vector<uint16_t> p16 = {300, 2}, q16 = {300, 3};
  Dev dp(4), dq(4);
  dp.put(p16.data());
  dq.put(q16.data());
  gpu()->reduce(DataType::kUInt16, ReduceOp::kProduct, dp.p, dq.p, 2, nullptr);
  EXPECT_EQ(dp.get<uint16_t>(), (std::vector<uint16_t>{24464, 6}));
}

// The fused device Adam against the CPU step on the same inputs (to float
// rounding: the GPU contracts multiply-adds), over tensors of odd sizes, with
// bfloat16 gradients and copies, and more tensors than one launch takes.
TEST(CudaBackend, AdamMatchesTheCpuStep) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  AdamHyper h;
  h.lr = 1e-2f;
  h.weightDecay = 0.1f;
  h.adamw = true;
  h.step = 3;
  h.gradScale = 0.5f;
  const AdamCoefficients c = adamCoefficients(h);
  for (DataType gd : {DataType::kFloat32, DataType::kBFloat16}) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 60; ++i) sizes.push_back(1 + (i * 7919) % 5000);
    sizes.push_back((1 << 20) + 3);
    std::vector<std::vector<float>> p, m, v, want;
    std::vector<std::vector<uint16_t>> g16, wantLow;
    std::vector<std::vector<float>> g32;
    std::vector<std::unique_ptr<Dev>> dp, dm, dv, dg, dl;
    std::vector<OptimTensor> ts;
    for (size_t n : sizes) {
      p.emplace_back(n), m.emplace_back(n), v.emplace_back(n), g32.emplace_back(n), g16.emplace_back(n);
      for (size_t i = 0; i < n; ++i) {
        p.back()[i] = u(rng), m.back()[i] = u(rng) * 0.1f, v.back()[i] = std::abs(u(rng)) * 0.01f;
        g16.back()[i] = floatToBf16(u(rng));
        g32.back()[i] = gd == DataType::kFloat32 ? u(rng) : bf16ToFloat(g16.back()[i]);
      }
      dp.push_back(std::make_unique<Dev>(n * 4)), dm.push_back(std::make_unique<Dev>(n * 4));
      dv.push_back(std::make_unique<Dev>(n * 4)), dl.push_back(std::make_unique<Dev>(n * 2));
      dg.push_back(std::make_unique<Dev>(n * (gd == DataType::kFloat32 ? 4 : 2)));
      dp.back()->put(p.back().data()), dm.back()->put(m.back().data()), dv.back()->put(v.back().data());
      dg.back()->put(gd == DataType::kFloat32 ? static_cast<const void*>(g32.back().data()) : g16.back().data());
      ts.push_back({static_cast<float*>(dp.back()->p), static_cast<float*>(dm.back()->p),
                    static_cast<float*>(dv.back()->p), dg.back()->p, dl.back()->p, n});
      want.push_back(p.back());
      wantLow.emplace_back(n);
      cpuAdamStep(c, want.back().data(), g32.back().data(), m.back().data(), v.back().data(), n,
                        wantLow.back().data(), DataType::kBFloat16);
    }
    gpu()->adam(c, gd, DataType::kBFloat16, ts.data(), ts.size(), nullptr);
    for (size_t k = 0; k < sizes.size(); ++k) {
      auto got = dp[k]->get<float>();
      auto low = dl[k]->get<uint16_t>();
      for (size_t i = 0; i < sizes[k]; ++i) {
        ASSERT_NEAR(got[i], want[k][i], 2e-6f * (1 + std::abs(want[k][i]))) << dtypeName(gd) << " " << k << " " << i;
        ASSERT_NEAR(bf16ToFloat(low[i]), bf16ToFloat(wantLow[k][i]), 1e-2f * (1 + std::abs(want[k][i]))) << k << " " << i;
      }
    }
  }
}

TEST(CudaBackend, SumOfSquaresMatchesTheCpuAndCarriesOverflow) {
  const size_t n = (1 << 22) + 11;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = floatToHalf(u(rng));
  Dev dh(n * 2), out(8);
  dh.put(h.data());
  const double zeroD = 0.0;
  out.put(&zeroD);
  gpu()->sumSquares(DataType::kFloat16, dh.p, n, static_cast<double*>(out.p), nullptr);
  const double want = sumSquares(h.data(), DataType::kFloat16, n);
  EXPECT_NEAR(out.get<double>()[0], want, 1e-5 * want);
  h[n / 2] = 0x7c00;  // +inf in float16: the overflow the loss scaler looks for
  dh.put(h.data());
  out.put(&zeroD);
  gpu()->sumSquares(DataType::kFloat16, dh.p, n, static_cast<double*>(out.p), nullptr);
  EXPECT_TRUE(std::isinf(out.get<double>()[0]));
}

TEST(CudaBackend, CastRoundsAsTheCpuDoes) {
  const size_t n = 100001;
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(std::sin(i * 0.37) * 1000.0);
  Dev df(n * 4), dh(n * 2), db(n * 2);
  df.put(f.data());
  gpu()->cast(DataType::kFloat16, dh.p, DataType::kFloat32, df.p, n, nullptr);
  gpu()->cast(DataType::kBFloat16, db.p, DataType::kFloat32, df.p, n, nullptr);
  auto half = dh.get<uint16_t>();
  auto bf = db.get<uint16_t>();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(half[i], floatToHalf(f[i])) << i;
    ASSERT_EQ(bf[i], floatToBf16(f[i])) << i;
  }
}

TEST(CudaBackend, BatchedCopyPacksAndUnpacksOddSizes) {
  std::vector<size_t> sizes = {1, 3, 16, 17, 4096, 100003, 7};
  for (int i = 0; i < 70; ++i) sizes.push_back(33 + i);  // more items than one launch takes
  size_t total = 0;
  for (size_t s : sizes) total += s;
  std::vector<char> src(total), back(total);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<char>(i * 7 + 3);
  Dev packed(total), out(total);
  std::vector<std::unique_ptr<Dev>> pieces;
  std::vector<CopyItem> in, outItems;
  size_t at = 0;
  for (size_t s : sizes) {
    pieces.push_back(std::make_unique<Dev>(s));
    pieces.back()->put(src.data() + at);
    in.push_back({static_cast<char*>(packed.p) + at, pieces.back()->p, s});
    outItems.push_back({static_cast<char*>(out.p) + at, static_cast<char*>(packed.p) + at, s});
    at += s;
  }
  gpu()->batchedCopy(in.data(), in.size(), nullptr);
  gpu()->batchedCopy(outItems.data(), outItems.size(), nullptr);
  EXPECT_EQ(out.get<char>(), src);
}

TEST(CudaBackend, AStreamWaitsForAnEventRecordedOnAnother) {
  auto b = gpu();
  void* s1 = b->createStream(0);
  void* s2 = b->createStream(0);
  void* e = b->createEvent(0);
  const size_t n = 64 << 20;
  Dev big(n * 4), small(4);
  std::vector<float> ones(n, 1.0f);
  void* pinned = b->allocPinned(n * 4);
  std::memcpy(pinned, ones.data(), n * 4);
  // s1: a slow upload then a scale; s2 reads the last element only after the event.
  b->copy(big.p, pinned, n * 4, s1);
  b->scale(DataType::kFloat32, big.p, big.p, n, 3.0, s1);
  b->record(e, s1);
  b->streamWait(s2, e);
  b->copy(small.p, static_cast<float*>(big.p) + n - 1, 4, s2);
  b->synchronizeStream(s2);
  EXPECT_EQ(small.get<float>()[0], 3.0f);
  EXPECT_TRUE(b->query(e));
  b->freePinned(pinned);
  b->destroyEvent(e);
  b->destroyStream(s1);
  b->destroyStream(s2);
}

// run.sh names torch's libnccl.so.2 in CHORUS_NCCL_LIBRARY: this program never
// imports chorus's Python package, whose search list finds it otherwise.
TEST(CudaBackend, NcclOpensWithItsVersion) {
  const char* named = std::getenv("CHORUS_NCCL_LIBRARY");
  ASSERT_TRUE(named && *named) << "CHORUS_NCCL_LIBRARY is not set (tests/gpu/run.sh sets it to torch's NCCL)";
  const NcclApi& api = ncclApi();
  EXPECT_EQ(api.path, named);
  std::printf("NCCL %s from %s\n", api.versionString().c_str(), api.path.c_str());
  EXPECT_GE(api.version, kMinNcclVersion);
  EXPECT_EQ(ncclBuilt(), api.version);
}

}  // namespace
}  // namespace chorus
