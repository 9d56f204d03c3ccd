// The reduction kernels of the instruction set CHORUS_SIMD selects (ctest runs
// this file once per level), against float64 references.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "reduce/half.h"

#include "chorus/error.h"
#include "harness.h"
#include "device/element_ops.h"
#include "reduce/reduce.h"
#include "reduce/cast.h"

namespace chorus::testing {
namespace {

// The device kernels' integer reduction (device/element_ops.h) and the CPU
// kernels agree, and both wrap in the integer type (values worked by hand).
TEST(Kernels, IntegersReduceInTheirOwnTypeAndWrapOnCpuAndDeviceAlike) {
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(reduceInteger<int64_t>(big, 2, 0), big + 2);  // (through double: 2^53 + 4)
  EXPECT_EQ(reduceInteger<int64_t>(INT64_MAX, 1, 0), INT64_MIN);
  EXPECT_EQ(reduceInteger<uint8_t>(200, 100, 0), 44);  // (through float: saturated at 255)
  EXPECT_EQ(reduceInteger<int8_t>(100, 100, 0), -56);
  EXPECT_EQ(reduceInteger<uint16_t>(300, 300, 4), 24464);
  EXPECT_EQ(reduceInteger<int32_t>(-7, 3, 2), -7);
  EXPECT_EQ(reduceInteger<int32_t>(-7, 3, 3), 3);
  EXPECT_EQ(reduceInteger<bool>(true, false, 0), true);
  EXPECT_EQ(reduceInteger<bool>(true, false, 4), false);
  auto cpu = [](DataType t, ReduceOp op, auto a, auto b) {
    decltype(a) out{};
    reduceBuffers(t, op, &out, &a, &b, 1);
    return out;
  };
  for (int op : {0, 2, 3, 4}) {
    const auto o = static_cast<ReduceOp>(op);
    EXPECT_EQ(cpu(DataType::kInt64, o, big, int64_t{3}), reduceInteger<int64_t>(big, 3, op)) << op;
    EXPECT_EQ(cpu(DataType::kUInt8, o, uint8_t{200}, uint8_t{100}), reduceInteger<uint8_t>(200, 100, op)) << op;
    EXPECT_EQ(cpu(DataType::kInt8, o, int8_t{-100}, int8_t{-100}), reduceInteger<int8_t>(-100, -100, op)) << op;
    EXPECT_EQ(cpu(DataType::kUInt16, o, uint16_t{300}, uint16_t{301}), reduceInteger<uint16_t>(300, 301, op)) << op;
  }
}

TEST(Kernels, RunTheRequestedInstructionSet) {
  const char* want = std::getenv("CHORUS_SIMD");
  if (!want || std::string(want) == "auto") GTEST_SKIP() << "no level requested";
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  std::string expect = want;
  if (expect == "avx512" && !avx512) GTEST_SKIP() << "CPU lacks AVX-512";
  if (expect == "avx2" && !avx2) GTEST_SKIP() << "CPU lacks AVX2";
  EXPECT_EQ(std::string(simdLevel()), expect);
}

TEST(Kernels, ReduceManyMatchesFloat64) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> small(-8, 8);
  for (DataType dt : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int n : {1, 2, 3, 5}) {
        const int64_t count = 2053;  // several blocks and an odd tail
        std::vector<HostBuffer> ins;
        std::vector<const void*> ptrs;
        for (int j = 0; j < n; ++j) {
          ins.emplace_back(dt, Shape{count});
          for (int64_t i = 0; i < count; ++i) {
            double v = dt == DataType::kBool ? (small(gen) > 0) : op == ReduceOp::kProduct ? 1 + (i + j) % 2 : small(gen);
            if (dt == DataType::kUInt8 || dt == DataType::kUInt16) v = std::abs(v);
            ins.back().set(i, v);
          }
        }
        for (auto& b : ins) ptrs.push_back(b.tensor().data);
        HostBuffer out(dt, {count});
        reduceMany(dt, op, out.tensor().data, ptrs.data(), n, count);
        for (int64_t i = 0; i < count; ++i) {
          double want = ins[0].get(i);
          for (int j = 1; j < n; ++j) {
            double v = ins[j].get(i);
            if (dt == DataType::kBool) {
              want = (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? (want && v) : (want || v);
            } else if (op == ReduceOp::kSum) {
              want += v;
            } else if (op == ReduceOp::kMin) {
              want = std::min(want, v);
            } else if (op == ReduceOp::kMax) {
              want = std::max(want, v);
            } else {
              want *= v;
            }
          }
          ASSERT_NEAR(out.get(i), want, tolerance(dt, want)) << dtypeName(dt) << " " << reduceOpName(op) << " n=" << n;
        }
      }
    }
  }
}

// The streamed variant writes reduceMany's exact bits (reduceMany is checked
// against float64 above) into every output and the cached one, at every
// position within a line (shared by the outputs, or not), for every count.
bool floating(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 || dt == DataType::kFloat32 || dt == DataType::kFloat64;
}

TEST(Kernels, ReduceManyStreamedWritesReduceManysBitsEverywhere) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> real(-4, 4);
  std::uniform_int_distribution<int> small(-8, 8);
  for (DataType dt : kAllDtypes) {
    const size_t es = dtypeSize(dt);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int n : {1, 2, 3}) {
        for (int64_t count : {0, 1, 5, 37, 1100, 2053}) {
          std::vector<HostBuffer> ins;
          std::vector<const void*> ptrs;
          for (int j = 0; j < n; ++j) {
            ins.emplace_back(dt, Shape{count});
            for (int64_t i = 0; i < count; ++i) {
              double v = dt == DataType::kBool ? (small(gen) > 0)
                         : floating(dt)        ? (op == ReduceOp::kProduct ? 1 + real(gen) / 8 : real(gen))
                         : op == ReduceOp::kProduct ? 1 + (i + j) % 2
                                                    : small(gen);
              if (dt == DataType::kUInt8 || dt == DataType::kUInt16) v = std::abs(v);
              ins.back().set(i, v);
            }
            ptrs.push_back(ins.back().tensor().data);
          }
          std::vector<char> want(count * es + 1);
          reduceMany(dt, op, want.data(), ptrs.data(), n, count);
          for (int outs : {1, 2, 3}) {
            for (size_t shift : {size_t{0}, es, 40 - 40 % es, 64 - es}) {
              for (bool together : {true, false}) {
                for (bool withCached : {false, true}) {
                  // Each output in its own 64-aligned buffer, `shift` bytes in (the
                  // second output one element further when not together).
                  std::vector<std::vector<char>> mem(outs + 1, std::vector<char>(count * es + 192));
                  std::vector<void*> dst;
                  for (int k = 0; k < outs; ++k) {
                    char* base = mem[k].data() + (64 - reinterpret_cast<uintptr_t>(mem[k].data()) % 64) % 64;
                    dst.push_back(base + shift + (!together && k == 1 ? es : 0));
                  }
                  char* cached = withCached ? mem[outs].data() + es : nullptr;
                  reduceManyStreamed(dt, op, cached, dst.data(), outs, ptrs.data(), n, count);
                  const std::string where = std::string(dtypeName(dt)) + " " + reduceOpName(op) +
                                            " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                            " outs=" + std::to_string(outs) + " shift=" + std::to_string(shift) +
                                            (together ? "" : " apart") + (withCached ? " cached" : "");
                  for (int k = 0; k < outs; ++k)
                    ASSERT_EQ(std::memcmp(dst[k], want.data(), count * es), 0) << where << " output " << k;
                  if (cached) {
                    ASSERT_EQ(std::memcmp(cached, want.data(), count * es), 0) << where << " cached";
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(Kernels, ReduceManyMayWriteIntoAnInput) {
  HostBuffer a(DataType::kFloat16, {1000}), b(DataType::kFloat16, {1000});
  for (int i = 0; i < 1000; ++i) {
    a.set(i, i % 17);
    b.set(i, 0.5);
  }
  const void* ptrs[2] = {a.tensor().data, b.tensor().data};
  reduceMany(DataType::kFloat16, ReduceOp::kSum, b.tensor().data, ptrs, 2, 1000);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b.get(i), i % 17 + 0.5);
}

TEST(Kernels, ScaleAndPairwiseReduce) {
  HostBuffer x(DataType::kBFloat16, {300}), y(DataType::kBFloat16, {300});
  for (int i = 0; i < 300; ++i) {
    x.set(i, i % 5);
    y.set(i, 2);
  }
  reduceBuffers(DataType::kBFloat16, ReduceOp::kMax, x.tensor().data, x.tensor().data, y.tensor().data, 300);
  scaleBuffer(DataType::kBFloat16, x.tensor().data, 300, 0.5);
  for (int i = 0; i < 300; ++i) ASSERT_EQ(x.get(i), std::max(i % 5, 2) * 0.5);
}

// Every float16 and bfloat16 bit pattern, combined with a few partners chosen
// for rounding ties, overflow, subnormals, zeros and NaN: every kernel entry
// (reduceMany, streamed, pairwise, scaling) gives the bits of the scalar
// conversions in half.h applied around float32 arithmetic.
TEST(Kernels, HalfTypesRoundLikeTheScalarConversions) {
  struct Conv {
    DataType dt;
    float (*toF)(uint16_t);
    uint16_t (*fromF)(float);
  };
  const Conv convs[] = {{DataType::kBFloat16, bf16ToFloat, floatToBf16}, {DataType::kFloat16, halfToFloat, floatToHalf}};
  auto isNan = [](float f) { return f != f; };
  for (const Conv& c : convs) {
    const size_t count = 65536 + 3;  // every pattern, and a tail past the vector width
    std::vector<uint16_t> a(count), b(count), want(count), got(count);
    for (size_t i = 0; i < count; ++i) a[i] = static_cast<uint16_t>(i);
    const uint16_t partners[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x7f7f, 0x0080, 0x3c00, 0x7bff, 0x7fc0};
    for (uint16_t p : partners) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        std::fill(b.begin(), b.end(), p);
        if (isNan(c.toF(p))) continue;  // NaN with NaN: which payload survives is the CPU's choice
        for (size_t i = 0; i < count; ++i) {
          const float x = c.toF(a[i]), y = c.toF(p);
          const float r = op == ReduceOp::kSum   ? x + y
                          : op == ReduceOp::kMin ? (y < x ? y : x)
                          : op == ReduceOp::kMax ? (x < y ? y : x)
                                                 : x * y;
          want[i] = c.fromF(r);
        }
        const void* ins[2] = {a.data(), b.data()};
        const std::string where = std::string(dtypeName(c.dt)) + " " + reduceOpName(op) + " partner " + std::to_string(p);
        // NaN results only need to be NaN: F16C keeps a float16 NaN's payload,
        // the scalar conversion does not.
        auto expectSame = [&](const char* entry) {
          for (size_t i = 0; i < count; ++i) {
            if (isNan(c.toF(want[i]))) ASSERT_TRUE(isNan(c.toF(got[i]))) << where << " " << entry << " at " << a[i];
            else ASSERT_EQ(got[i], want[i]) << where << " " << entry << " at pattern " << a[i];
          }
        };
        reduceMany(c.dt, op, got.data(), ins, 2, count);
        expectSame("reduceMany");
        std::vector<uint16_t> line(count + 32);
        uint16_t* out = line.data() + (64 - reinterpret_cast<uintptr_t>(line.data()) % 64) % 64 / 2;
        void* outs[1] = {out};
        reduceManyStreamed(c.dt, op, nullptr, outs, 1, ins, 2, count);
        std::copy(out, out + count, got.begin());
        expectSame("reduceManyStreamed");
        reduceBuffers(c.dt, op, got.data(), a.data(), b.data(), count);
        expectSame("reduceBuffers");
      }
    }
    for (double factor : {0.5, 3.0, 1e-3}) {
      for (size_t i = 0; i < count; ++i) want[i] = c.fromF(c.toF(a[i]) * static_cast<float>(factor));
      scaleCopy(c.dt, got.data(), a.data(), count, factor);
      for (size_t i = 0; i < count; ++i) {
        if (isNan(c.toF(a[i]))) continue;  // scaled NaN: quieted either way, payload the CPU's
        ASSERT_EQ(got[i], want[i]) << dtypeName(c.dt) << " scaled by " << factor << " at pattern " << a[i];
      }
    }
  }
}

// A scaled reduction (Average's division folded in) gives, bit for bit, the
// sum taken in input order in the accumulation type, times the factor in that
// type, rounded once: through reduceMany and its streamed form, every length.
TEST(Kernels, ScaledReductionsRoundOnceAfterTheFactor) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> real(-100, 100);
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    const size_t es = dtypeSize(dt);
    for (int n : {1, 2, 3, 5}) {
      const double scale = 1.0 / n;
      for (size_t count : {size_t{1}, size_t{7}, size_t{37}, size_t{2053}}) {
        std::vector<HostBuffer> ins;
        std::vector<const void*> ptrs;
        for (int j = 0; j < n; ++j) {
          ins.emplace_back(dt, Shape{static_cast<int64_t>(count)});
          for (size_t i = 0; i < count; ++i) ins.back().set(static_cast<int64_t>(i), real(gen));
          ptrs.push_back(ins.back().tensor().data);
        }
        std::vector<char> want(count * es);
        for (size_t i = 0; i < count; ++i) {
          auto raw = [&](int j) { return static_cast<const char*>(ptrs[j]) + i * es; };
          if (dt == DataType::kFloat64) {
            double acc;
            std::memcpy(&acc, raw(0), 8);
            for (int j = 1; j < n; ++j) {
              double v;
              std::memcpy(&v, raw(j), 8);
              acc = acc + v;
            }
            acc = acc * scale;
            std::memcpy(want.data() + i * es, &acc, 8);
          } else {
            auto toF = [&](const char* p) {
              if (dt == DataType::kFloat32) {
                float f;
                std::memcpy(&f, p, 4);
                return f;
              }
              uint16_t h;
              std::memcpy(&h, p, 2);
              return dt == DataType::kFloat16 ? halfToFloat(h) : bf16ToFloat(h);
            };
            float acc = toF(raw(0));
            for (int j = 1; j < n; ++j) acc = acc + toF(raw(j));
            acc = acc * static_cast<float>(scale);
            if (dt == DataType::kFloat32) {
              std::memcpy(want.data() + i * es, &acc, 4);
            } else {
              const uint16_t h = dt == DataType::kFloat16 ? floatToHalf(acc) : floatToBf16(acc);
              std::memcpy(want.data() + i * es, &h, 2);
            }
          }
        }
        const std::string where = std::string(dtypeName(dt)) + " n=" + std::to_string(n) + " count=" + std::to_string(count);
        std::vector<char> got(count * es + 128);
        reduceMany(dt, ReduceOp::kAverage, got.data(), ptrs.data(), n, count, scale);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), count * es), 0) << where << " reduceMany";
        char* line = got.data() + (64 - reinterpret_cast<uintptr_t>(got.data()) % 64) % 64;
        void* outs[1] = {line};
        reduceManyStreamed(dt, ReduceOp::kSum, nullptr, outs, 1, ptrs.data(), n, count, scale);
        ASSERT_EQ(std::memcmp(line, want.data(), count * es), 0) << where << " streamed";
      }
    }
  }
  // Integers are divided apart (rounding down): a scale for them is a caller's bug.
  std::vector<int32_t> a(4, 6);
  const void* ins[1] = {a.data()};
  EXPECT_THROW(reduceMany(DataType::kInt32, ReduceOp::kSum, a.data(), ins, 1, 4, 0.5), Error);
}

}  // namespace
}  // namespace chorus::testing

namespace chorus::testing {
namespace {

// torch.maximum/minimum semantics: a NaN in any input makes that element NaN,
// whichever input (rank) holds it, in the vector body and in the tail.
TEST(Kernels, MinAndMaxPropagateNaNFromEveryInput) {
  struct Kind {
    DataType dt;
    size_t size;
    void (*put)(void*, size_t, float);
    float (*get)(const void*, size_t);
  };
  const Kind kinds[] = {
      {DataType::kFloat32, 4, [](void* p, size_t i, float v) { static_cast<float*>(p)[i] = v; },
       [](const void* p, size_t i) { return static_cast<const float*>(p)[i]; }},
      {DataType::kFloat64, 8, [](void* p, size_t i, float v) { static_cast<double*>(p)[i] = v; },
       [](const void* p, size_t i) { return static_cast<float>(static_cast<const double*>(p)[i]); }},
      {DataType::kFloat16, 2, [](void* p, size_t i, float v) { static_cast<uint16_t*>(p)[i] = floatToHalf(v); },
       [](const void* p, size_t i) { return halfToFloat(static_cast<const uint16_t*>(p)[i]); }},
      {DataType::kBFloat16, 2, [](void* p, size_t i, float v) { static_cast<uint16_t*>(p)[i] = floatToBf16(v); },
       [](const void* p, size_t i) { return bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }},
  };
  const size_t count = 77;  // whole registers and a tail at every instruction-set level
  for (const Kind& k : kinds) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      for (int n = 2; n <= 4; ++n) {
        std::vector<std::vector<char>> in(n, std::vector<char>(count * k.size));
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < count; ++i) k.put(in[j].data(), i, static_cast<float>((i * 7 + j * 3) % 11) - 5.0f);
        // Element i holds a NaN in input i % (n + 1) (none when that is n).
        for (size_t i = 0; i < count; ++i)
          if (static_cast<int>(i % (n + 1)) < n) k.put(in[i % (n + 1)].data(), i, std::nanf(""));
        std::vector<const void*> ptrs;
        for (auto& v : in) ptrs.push_back(v.data());
        std::vector<char> out(count * k.size);
        reduceMany(k.dt, op, out.data(), ptrs.data(), n, count);
        for (size_t i = 0; i < count; ++i) {
          const float got = k.get(out.data(), i);
          const std::string where = std::string(dtypeName(k.dt)) + " " + reduceOpName(op) + " n=" +
                                    std::to_string(n) + " element " + std::to_string(i);
          if (static_cast<int>(i % (n + 1)) < n) {
            EXPECT_TRUE(std::isnan(got)) << where << " (NaN in input " << i % (n + 1) << ") gave " << got;
          } else {
            float want = k.get(in[0].data(), i);
            for (int j = 1; j < n; ++j) {
              const float v = k.get(in[j].data(), i);
              want = op == ReduceOp::kMin ? std::min(want, v) : std::max(want, v);
            }
            EXPECT_EQ(got, want) << where;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::testing

namespace chorus::testing {
namespace {

TEST(Cast, ElementsToAndFromDoubleInEveryDtype) {
  // Values every dtype holds exactly, written and read back, and read through the
  // dtype's own C type (the independent side).
  for (DataType dt : {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kUInt16, DataType::kInt32,
                      DataType::kInt64, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                      DataType::kFloat64, DataType::kBool}) {
    std::vector<char> buf(4 * dtypeSize(dt));
    const double v = dt == DataType::kBool ? 1 : 3;
    elementFromDouble(buf.data(), dt, 2, v);
    EXPECT_EQ(elementToDouble(buf.data(), dt, 2), v) << dtypeName(dt);
    EXPECT_EQ(elementToDouble(buf.data(), dt, 1), 0) << dtypeName(dt);
  }
  int32_t i32[1];
  elementFromDouble(i32, DataType::kInt32, 0, -2.75);  // toward zero, as a C cast
  EXPECT_EQ(i32[0], -2);
  uint16_t h[1];
  elementFromDouble(h, DataType::kFloat16, 0, 2.5);
  EXPECT_EQ(h[0], 0x4100);  // IEEE half: sign 0, exponent 16, mantissa 0x100
  elementFromDouble(h, DataType::kBFloat16, 0, -1.0);
  EXPECT_EQ(h[0], 0xbf80);  // the top half of float -1.0f (0xbf800000)
  uint8_t b[1];
  elementFromDouble(b, DataType::kBool, 0, -0.5);
  EXPECT_EQ(b[0], 1);
  // castElements goes through the same pair: int64 -> bfloat16 -> float64.
  const int64_t ints[3] = {-7, 0, 256};
  uint16_t mid[3];
  double out[3];
  castElements(DataType::kBFloat16, mid, DataType::kInt64, ints, 3);
  castElements(DataType::kFloat64, out, DataType::kBFloat16, mid, 3);
  EXPECT_EQ(out[0], -7.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[2], 256.0);
}

}  // namespace
}  // namespace chorus::testing
