#include "reduce/adasum.h"

#include <cstdint>
#include <vector>

#include "chorus/error.h"
#include "reduce/half.h"

namespace chorus {

namespace {

// a = acoeff a + bcoeff b, the coefficients from the dot product and norms
// (in double). A vector of (near) zero norm keeps coefficient 1: zero is
// Adasum's identity, so a joined rank's zeros leave the others' result as is.
template <typename C>
void combinePair(C* a, const C* b, size_t n) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  const double ca = aa >= 1e-8 ? 1.0 - 0.5 * dot / aa : 1.0;
  const double cb = bb >= 1e-8 ? 1.0 - 0.5 * dot / bb : 1.0;
  const C fa = static_cast<C>(ca), fb = static_cast<C>(cb);
  for (size_t i = 0; i < n; ++i) a[i] = fa * a[i] + fb * b[i];
}

template <typename C>
void tree(std::vector<C*>& v, size_t count) {
  const int n = static_cast<int>(v.size());
  for (int level = 1; level < n; level *= 2)
    for (int i = 0; i + level < n; i += 2 * level) combinePair(v[i], v[i + level], count);
}

// Loads every input into one working copy of type C, combines, stores v[0].
template <typename C, typename Load, typename Store>
void run(void* out, const void* const* inputs, int n, size_t count, Load load, Store store) {
  thread_local std::vector<C> work;
  work.resize(static_cast<size_t>(n) * count);
  std::vector<C*> v(n);
  for (int j = 0; j < n; ++j) {
    v[j] = work.data() + static_cast<size_t>(j) * count;
    load(v[j], inputs[j], count);
  }
  tree(v, count);
  store(out, v[0], count);
}

template <typename T>
void runPlain(void* out, const void* const* inputs, int n, size_t count) {
  auto copyIn = [](T* to, const void* from, size_t c) {
    const T* f = static_cast<const T*>(from);
    for (size_t i = 0; i < c; ++i) to[i] = f[i];
  };
  auto copyOut = [](void* to, const T* from, size_t c) {
    T* t = static_cast<T*>(to);
    for (size_t i = 0; i < c; ++i) t[i] = from[i];
  };
  run<T>(out, inputs, n, count, copyIn, copyOut);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void runHalf(void* out, const void* const* inputs, int n, size_t count) {
  auto load = [](float* to, const void* from, size_t c) {
    const uint16_t* f = static_cast<const uint16_t*>(from);
    for (size_t i = 0; i < c; ++i) to[i] = ToFloat(f[i]);
  };
  auto store = [](void* to, const float* from, size_t c) {
    uint16_t* t = static_cast<uint16_t*>(to);
    for (size_t i = 0; i < c; ++i) t[i] = FromFloat(from[i]);
  };
  run<float>(out, inputs, n, count, load, store);
}

}  // namespace

void adasumCombine(DataType dtype, void* out, const void* const* inputs, int n, size_t count) {
  switch (dtype) {
    case DataType::kFloat32: return runPlain<float>(out, inputs, n, count);
    case DataType::kFloat64: return runPlain<double>(out, inputs, n, count);
    case DataType::kFloat16: return runHalf<halfToFloat, floatToHalf>(out, inputs, n, count);
    case DataType::kBFloat16: return runHalf<bf16ToFloat, floatToBf16>(out, inputs, n, count);
    default: break;
  }
  throw InvalidArgument(std::string("Adasum needs a floating-point tensor, not ") + dtypeName(dtype));
}

}  // namespace chorus
