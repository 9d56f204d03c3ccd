#include "device/loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "chorus/error.h"
#include "chorus/settings.h"

namespace chorus {

namespace {

using CreateFn = DeviceBackend* (*)(int, char*, size_t);

// The folder libchorus itself was loaded from.
std::string ownFolder() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&cudaBackendBuilt), &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

struct Opened {
  void* handle = nullptr;
  std::string error;  // why handle is null
  std::string path;
};

const Opened& library() {
  static const Opened opened = [] {
    Opened o;
#ifdef CHORUS_WITH_CUDA
    std::string env;
    o.path = readSetting("CHORUS_CUDA_BACKEND", &env) && !env.empty() ? env : ownFolder() + "libchorus_cuda.so";
    o.handle = dlopen(o.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!o.handle) o.error = std::string("cannot open the CUDA backend ") + o.path + ": " + dlerror();
#else
    o.error = "this chorus was built without CUDA (no nvcc was found when it was built)";
#endif
    return o;
  }();
  return opened;
}

}  // namespace

bool cudaBackendBuilt() {
  const Opened& o = library();
  return o.handle && dlsym(o.handle, "chorus_device_backend_create");
}

std::shared_ptr<DeviceBackend> openCudaBackend() {
  static std::mutex mu;
  // Made once and kept for the life of the process (CUDA state is per process).
  static std::shared_ptr<DeviceBackend> backend;
  std::lock_guard<std::mutex> lock(mu);
  if (backend) return backend;
  const Opened& o = library();
  if (!o.handle) throw Error("CUDA tensors need chorus's CUDA backend: " + o.error);
  auto create = reinterpret_cast<CreateFn>(dlsym(o.handle, "chorus_device_backend_create"));
  if (!create) throw Error(o.path + " has no chorus_device_backend_create: not a chorus CUDA backend");
  char err[512] = {0};
  DeviceBackend* b = create(kDeviceBackendAbi, err, sizeof err);
  if (!b) throw Error(std::string("CUDA tensors cannot be used here: ") + err);
  backend.reset(b);
  return backend;
}

}  // namespace chorus

namespace chorus {
bool cudaBuilt() { return cudaBackendBuilt(); }
std::shared_ptr<DeviceBackend> backendOrCuda(const std::shared_ptr<DeviceBackend>& given) {
  return given ? given : openCudaBackend();
}

}  // namespace chorus
