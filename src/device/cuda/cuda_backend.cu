// The device interface on CUDA: libchorus_cuda, opened by device/loader.cc at
// run time. The CUDA runtime is linked statically: handles of torch's runtime
// (its streams) are the driver's and work here unchanged.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "chorus/error.h"
#include "device/device_backend.h"
#include "device/element_ops.h"

namespace chorus {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();  // (clears a non-sticky error)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(rc));
  }
}

// Whether the device's primary context exists: the driver's
// cuDevicePrimaryCtxGetState, reached through the runtime (no libcuda link).
bool hasContext(int ordinal) {
  using GetDevice = int (*)(int*, int);
  using GetState = int (*)(int, unsigned*, int*);
  static GetDevice getDevice = nullptr;
  static GetState getState = nullptr;
  static const bool found = [] {
    cudaDriverEntryPointQueryResult q1{}, q2{};
    return cudaGetDriverEntryPointByVersion("cuDeviceGet", reinterpret_cast<void**>(&getDevice), 12000,
                                            cudaEnableDefault, &q1) == cudaSuccess &&
           cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", reinterpret_cast<void**>(&getState), 12000,
                                            cudaEnableDefault, &q2) == cudaSuccess &&
           q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess;
  }();
  if (!found) return true;  // (unknown: behave as before, restore)
  int dev = 0, active = 0;
  unsigned flags = 0;
  if (getDevice(&dev, ordinal) != 0 || getState(dev, &flags, &active) != 0) return true;
  return active != 0;
}

// Makes ordinal current for a scope (CUDA's current device is per thread). The
// previous device comes back only if it has a context: restoring the device 0
// of a thread that never chose one would create a context there.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (ordinal >= 0 && ordinal != prev_) {
      if (!hasContext(prev_)) prev_ = -1;
      check(cudaSetDevice(ordinal), "cudaSetDevice");
    } else {
      prev_ = -1;
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

constexpr int kThreads = 256;
constexpr int kItemsPerLaunch = 64;  // CopyItems passed by value (1.5 KiB of parameters)

// Items of a multi-tensor kernel, passed by value (one block row per item).
template <typename T, size_t K>
struct Batch {
  T items[K];
};
using CopyBatch = Batch<CopyItem, kItemsPerLaunch>;

// One block row per item; 16-byte moves where both ends and the size allow.
__global__ void batchedCopyKernel(CopyBatch batch) {
  const CopyItem c = batch.items[blockIdx.y];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool wide = ((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) | c.bytes) & 15) == 0;
  if (wide) {
    uint4* d = static_cast<uint4*>(c.dst);
    const uint4* s = static_cast<const uint4*>(c.src);
    for (size_t i = first; i < c.bytes / 16; i += stride) d[i] = s[i];
  } else {
    char* d = static_cast<char*>(c.dst);
    const char* s = static_cast<const char*>(c.src);
    for (size_t i = first; i < c.bytes; i += stride) d[i] = s[i];
  }
}

// Compute type: float for 16-bit floats, double for double and integers
// (integers truncate toward zero, as the CPU kernels do).
template <typename T> struct Acc { using type = double; };
template <> struct Acc<float> { using type = float; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

template <typename T> __device__ inline typename Acc<T>::type load(T v) { return static_cast<typename Acc<T>::type>(v); }
template <> __device__ inline float load(__half v) { return __half2float(v); }
template <> __device__ inline float load(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ inline T store(typename Acc<T>::type v) { return static_cast<T>(v); }
template <> __device__ inline __half store<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 store<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ inline bool store<bool>(double v) { return v != 0; }

template <typename T>
__global__ void scaleKernel(T* dst, const T* src, size_t n, double factor) {
  const auto f = static_cast<typename Acc<T>::type>(factor);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = store<T>(load(src[i]) * f);
}

template <typename T>
__global__ void divideKernel(T* buf, size_t n, int64_t divisor) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
  {  // rounds down (floor), as the CPU path and torch's floor_divide
    const int64_t a = static_cast<int64_t>(buf[i]), q = a / divisor;
    buf[i] = static_cast<T>((a % divisor != 0 && ((a < 0) != (divisor < 0))) ? q - 1 : q);
  }
}

template <typename From, typename To>
__global__ void castKernel(To* dst, const From* src, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = store<To>(static_cast<typename Acc<To>::type>(load(src[i])));
}

template <typename T>
__global__ void reduceKernel(T* dst, const T* src, size_t n, int op) {
  if constexpr (std::is_integral<T>::value) {  // (in the type itself: see element_ops.h)
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
      dst[i] = reduceInteger<T>(dst[i], src[i], op);
  } else {
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
      const auto a = load(dst[i]), b = load(src[i]);
      typename Acc<T>::type r;
      switch (op) {
        case 2: r = a < b ? a : b; break;
        case 3: r = a > b ? a : b; break;
        case 4: r = a * b; break;
        default: r = a + b; break;
      }
      // NaN propagates through Min and Max, as torch's do.
      if ((op == 2 || op == 3) && (a != a || b != b)) r = a != a ? a : b;
      dst[i] = store<T>(r);
    }
  }
}

constexpr int kOptimPerLaunch = 48;  // OptimTensors passed by value (2.3 KiB of parameters)
using OptimBatch = Batch<OptimTensor, kOptimPerLaunch>;

// One block row per tensor; the CPU step's arithmetic (reduce/adam_kernels.inc).
template <typename G, typename L>
__global__ void adamKernel(AdamCoefficients c, OptimBatch batch) {
  const OptimTensor t = batch.items[blockIdx.y];
  float* __restrict p = t.master;
  float* __restrict m = t.state1;
  float* __restrict v = t.state2;
  const G* __restrict g = static_cast<const G*>(t.grad);
  L* __restrict low = static_cast<L*>(t.low);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float grad = static_cast<float>(load(g[i])) * c.gradScale + c.l2 * p[i];
    const float mi = m[i] * c.beta1 + (1.0f - c.beta1) * grad;
    const float vi = v[i] * c.beta2 + (1.0f - c.beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * c.decay - c.stepSize * mi / (sqrtf(vi) * c.invBias2Sqrt + c.eps);
    p[i] = pi;
    if (low) low[i] = store<L>(pi);
  }
}

// torch.optim.SGD's update (zero/optimizer_step.cc's cpuSgdStep).
template <typename G, typename L>
__global__ void sgdKernel(SgdCoefficients c, OptimBatch batch) {
  const OptimTensor t = batch.items[blockIdx.y];
  float* __restrict p = t.master;
  float* __restrict buf = t.state1;
  const G* __restrict g = static_cast<const G*>(t.grad);
  L* __restrict low = static_cast<L*>(t.low);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float d = static_cast<float>(load(g[i])) * c.gradScale + c.weightDecay * p[i];
    if (c.momentum != 0.0f) {
      const float b = c.first ? d : c.momentum * buf[i] + (1.0f - c.dampening) * d;
      buf[i] = b;
      d = c.nesterov ? d + c.momentum * b : b;
    }
    const float pi = p[i] - c.lr * d;
    p[i] = pi;
    if (low) low[i] = store<L>(pi);
  }
}

// Squares summed in float per thread, in double across the block and the grid.
template <typename T>
__global__ void sumSquaresKernel(const T* src, size_t n, double* out) {
  __shared__ double part[kThreads];
  float acc = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = static_cast<float>(load(src[i]));
    acc += x * x;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

unsigned blocksFor(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(b, 4096)));
}

// Calls launch(batch, grid) for items in batches of K; grid has a block row per
// item and columns for the largest (work(item): its units of work).
template <size_t K, typename T, typename Work, typename Launch>
void inBatches(const T* items, size_t n, Work work, Launch launch) {
  for (size_t at = 0; at < n; at += K) {
    Batch<T, K> b{};
    const size_t k = std::min<size_t>(K, n - at);
    size_t largest = 0;
    for (size_t i = 0; i < k; ++i) {
      b.items[i] = items[at + i];
      largest = std::max(largest, work(items[at + i]));
    }
    if (largest) launch(b, dim3(std::min<unsigned>(blocksFor(largest), 1024), static_cast<unsigned>(k)));
  }
}

// Calls fn with a null pointer of dtype's device type.
template <typename Fn>
void byType(DataType t, const char* what, Fn&& fn) {
  switch (t) {
    case DataType::kUInt8: return fn(static_cast<uint8_t*>(nullptr));
    case DataType::kInt8: return fn(static_cast<int8_t*>(nullptr));
    case DataType::kInt16: return fn(static_cast<int16_t*>(nullptr));
    case DataType::kUInt16: return fn(static_cast<uint16_t*>(nullptr));
    case DataType::kInt32: return fn(static_cast<int32_t*>(nullptr));
    case DataType::kInt64: return fn(static_cast<int64_t*>(nullptr));
    case DataType::kFloat16: return fn(static_cast<__half*>(nullptr));
    case DataType::kBFloat16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DataType::kFloat32: return fn(static_cast<float*>(nullptr));
    case DataType::kFloat64: return fn(static_cast<double*>(nullptr));
    case DataType::kBool: return fn(static_cast<bool*>(nullptr));
  }
  throw InvalidArgument(std::string(what) + ": unknown dtype");
}

template <typename Fn>
void byFloatType(DataType t, const char* what, Fn&& fn) {
  switch (t) {
    case DataType::kFloat16: return fn(static_cast<__half*>(nullptr));
    case DataType::kBFloat16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DataType::kFloat32: return fn(static_cast<float*>(nullptr));
    case DataType::kFloat64: return fn(static_cast<double*>(nullptr));
    default: throw InvalidArgument(std::string(what) + ": " + dtypeName(t) + " is not a floating dtype");
  }
}

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }

// An optimizer kernel's launches: launch(G*, L*, batch, grid) with the
// gradients' and the 16-bit copy's device types.
template <typename Launch>
void optimizerLaunch(DataType gradDtype, DataType lowDtype, const OptimTensor* tensors, size_t n, const char* what,
                     Launch launch) {
  if (lowDtype != DataType::kFloat16 && lowDtype != DataType::kBFloat16)
    throw InvalidArgument(std::string(what) + ": the 16-bit copy must be float16 or bfloat16, not " +
                          dtypeName(lowDtype));
  byFloatType(gradDtype, what, [&](auto* gt) {
    using G = std::remove_pointer_t<decltype(gt)>;
    if constexpr (std::is_same<G, double>::value) {
      throw InvalidArgument(std::string(what) + ": float64 gradients are not supported");
    } else {
      auto each = [&](auto* lt) {
        inBatches<kOptimPerLaunch>(tensors, n, [](const OptimTensor& t) { return t.n; },
                                  [&](const OptimBatch& b, dim3 grid) {
                                    launch(gt, lt, b, grid);
                                    check(cudaGetLastError(), what);
                                  });
      };
      if (lowDtype == DataType::kFloat16) each(static_cast<__half*>(nullptr));
      else each(static_cast<__nv_bfloat16*>(nullptr));
    }
  });
}

class CudaBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cuda"; }
  std::string version() const override {
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    return "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10) + ", driver " +
           std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10);
  }
  int count() const override {
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  int current() const override {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void setCurrent(int ordinal) override { check(cudaSetDevice(ordinal), "cudaSetDevice"); }
  bool active(int ordinal) const override { return hasContext(ordinal); }
  std::string identity(int ordinal) const override {
    char bus[64] = {0};
    check(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal), "cudaDeviceGetPCIBusId");
    return bus;
  }
  int deviceOf(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
  }
  void* allocDevice(int ordinal, size_t bytes) override {
    DeviceGuard g(ordinal);
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
    return p;
  }
  void freeDevice(void* p) override { check(cudaFree(p), "cudaFree"); }
  void* allocPinned(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void freePinned(void* p) override { check(cudaFreeHost(p), "cudaFreeHost"); }
  void* createStream(int ordinal) override {
    DeviceGuard g(ordinal);
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroyStream(void* s) override { check(cudaStreamDestroy(S(s)), "cudaStreamDestroy"); }
  void* createEvent(int ordinal) override {
    DeviceGuard g(ordinal);
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroyEvent(void* e) override { check(cudaEventDestroy(static_cast<cudaEvent_t>(e)), "cudaEventDestroy"); }
  void record(void* event, void* stream) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), S(stream)), "cudaEventRecord");
  }
  void streamWait(void* stream, void* event) override {
    check(cudaStreamWaitEvent(S(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  bool query(void* event) override {
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaEventQuery");
    return true;
  }
  void synchronize(void* event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }
  void synchronizeStream(void* stream) override { check(cudaStreamSynchronize(S(stream)), "cudaStreamSynchronize"); }
  void copy(void* dst, const void* src, size_t bytes, void* stream) override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream)), "cudaMemcpyAsync");
  }
  void zero(void* dst, size_t bytes, void* stream) override {
    if (bytes) check(cudaMemsetAsync(dst, 0, bytes, S(stream)), "cudaMemsetAsync");
  }
  void batchedCopy(const CopyItem* items, size_t n, void* stream) override {
    inBatches<kItemsPerLaunch>(
        items, n, [](const CopyItem& c) { return c.bytes ? c.bytes / 16 + 1 : 0; },
        [&](const CopyBatch& b, dim3 grid) {
          batchedCopyKernel<<<grid, kThreads, 0, S(stream)>>>(b);
          check(cudaGetLastError(), "batched copy kernel");
        });
  }
  void scale(DataType dtype, void* dst, const void* src, size_t n, double factor, void* stream) override {
    if (!n) return;
    byType(dtype, "scale", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      scaleKernel<T><<<blocksFor(n), kThreads, 0, S(stream)>>>(static_cast<T*>(dst), static_cast<const T*>(src), n,
                                                                 factor);
    });
    check(cudaGetLastError(), "scale kernel");
  }
  void divide(DataType dtype, void* buf, size_t n, int64_t divisor, void* stream) override {
    if (!n) return;
    auto launch = [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      divideKernel<T><<<blocksFor(n), kThreads, 0, S(stream)>>>(static_cast<T*>(buf), n, divisor);
    };
    switch (dtype) {  // floating dtypes (and bool) scale by 1/divisor; integers divide
      case DataType::kFloat16: case DataType::kBFloat16: case DataType::kFloat32: case DataType::kFloat64:
      case DataType::kBool: return scale(dtype, buf, buf, n, 1.0 / static_cast<double>(divisor), stream);
      default: byType(dtype, "divide", launch);
    }
    check(cudaGetLastError(), "divide kernel");
  }
  void cast(DataType to, void* dst, DataType from, const void* src, size_t n, void* stream) override {
    if (!n) return;
    byFloatType(from, "cast", [&](auto* f) {
      using F = std::remove_pointer_t<decltype(f)>;
      byFloatType(to, "cast", [&](auto* t) {
        using T = std::remove_pointer_t<decltype(t)>;
        castKernel<F, T><<<blocksFor(n), kThreads, 0, S(stream)>>>(static_cast<T*>(dst), static_cast<const F*>(src), n);
      });
    });
    check(cudaGetLastError(), "cast kernel");
  }
  void reduce(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, void* stream) override {
    if (!n) return;
    if (op == ReduceOp::kAdasum) throw InvalidArgument("device reduce: Adasum is not element-wise");
    byType(dtype, "reduce", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      reduceKernel<T><<<blocksFor(n), kThreads, 0, S(stream)>>>(static_cast<T*>(dst), static_cast<const T*>(src), n,
                                                                  static_cast<int>(op));
    });
    check(cudaGetLastError(), "reduce kernel");
  }
  void adam(const AdamCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors, size_t n,
            void* stream) override {
    optimizerLaunch(gradDtype, lowDtype, tensors, n, "adam", [&](auto* gt, auto* lt, const OptimBatch& b, dim3 grid) {
      using G = std::remove_pointer_t<decltype(gt)>;
      using L = std::remove_pointer_t<decltype(lt)>;
      adamKernel<G, L><<<grid, kThreads, 0, S(stream)>>>(c, b);
    });
  }
  void sgd(const SgdCoefficients& c, DataType gradDtype, DataType lowDtype, const OptimTensor* tensors, size_t n,
           void* stream) override {
    optimizerLaunch(gradDtype, lowDtype, tensors, n, "sgd", [&](auto* gt, auto* lt, const OptimBatch& b, dim3 grid) {
      using G = std::remove_pointer_t<decltype(gt)>;
      using L = std::remove_pointer_t<decltype(lt)>;
      sgdKernel<G, L><<<grid, kThreads, 0, S(stream)>>>(c, b);
    });
  }
  void sumSquares(DataType dtype, const void* src, size_t n, double* out, void* stream) override {
    if (!n) return;
    byFloatType(dtype, "sum of squares", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      sumSquaresKernel<T><<<blocksFor(n), kThreads, 0, S(stream)>>>(static_cast<const T*>(src), n, out);
    });
    check(cudaGetLastError(), "sum of squares kernel");
  }
};

}  // namespace
}  // namespace chorus

// The loader's one entry point. Returns null and fills err when no GPU can be used.
extern "C" __attribute__((visibility("default"))) chorus::DeviceBackend* chorus_device_backend_create(
    int abi, char* err, size_t errBytes) {
  auto fail = [&](const std::string& m) -> chorus::DeviceBackend* {
    std::snprintf(err, errBytes, "%s", m.c_str());
    return nullptr;
  };
  if (abi != chorus::kDeviceBackendAbi)
    return fail("libchorus_cuda was built for device interface " + std::to_string(chorus::kDeviceBackendAbi) +
                ", libchorus asks for " + std::to_string(abi));
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) return fail(std::string("no usable CUDA device: ") + cudaGetErrorString(rc));
  if (n == 0) return fail("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
  return new chorus::CudaBackend();
}
