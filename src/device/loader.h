#pragma once
// Opens the device backend at run time: libchorus_cuda beside libchorus (or
// where CHORUS_CUDA_BACKEND points), so that libchorus needs no CUDA to build,
// load or run. The one place that knows whether the CUDA backend was built.
#include <memory>
#include <string>

#include "device/device_backend.h"

namespace chorus {

// The CUDA backend library was built with this libchorus and can be opened
// (no GPU or driver needed for that).
bool cudaBackendBuilt();

// The CUDA backend, opened once per process; throws chorus::Error saying what
// is missing (the library, the driver, a device) when no GPU can be used.
std::shared_ptr<DeviceBackend> openCudaBackend();

// The backend a runtime uses: the one its Config gives (a test's host
// stand-in), else CUDA's, opened when first needed.
std::shared_ptr<DeviceBackend> backendOrCuda(const std::shared_ptr<DeviceBackend>& given);

}  // namespace chorus
