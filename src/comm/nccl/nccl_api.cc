#include "comm/nccl/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "chorus/error.h"
#include "chorus/settings.h"

namespace chorus {

namespace {

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& folders() {
  static std::vector<std::string> f;
  return f;
}

template <typename F>
void bind(void* lib, const char* sym, F* out, const std::string& path, bool required = true) {
  *out = reinterpret_cast<F>(dlsym(lib, sym));
  if (!*out && required) throw Error("NCCL at " + path + " lacks " + sym + ": not a usable NCCL");
}

NcclApi openNccl() {
  std::vector<std::string> tried;
  void* lib = nullptr;
  std::string path;
  auto attempt = [&](const std::string& p) {
    if (lib) return;
    lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) path = p;
    else tried.push_back(p + " (" + dlerror() + ")");
  };
  std::string env;
  if (readSetting("CHORUS_NCCL_LIBRARY", &env) && !env.empty()) {
    attempt(env);
    if (!lib) throw Error("CHORUS_NCCL_LIBRARY=" + env + " cannot be opened: " + tried.back());
  }
  {
    std::lock_guard<std::mutex> lock(mu());
    for (const std::string& f : folders()) attempt(f + "/libnccl.so.2");
  }
  attempt("libnccl.so.2");
  if (!lib) {
    std::string msg = "NCCL was not found; tried:";
    for (const auto& t : tried) msg += " " + t + ";";
    throw Error(msg + " set CHORUS_NCCL_LIBRARY to libnccl.so.2's path");
  }
  NcclApi a;
  a.path = path;
  int (*getVersion)(int*) = nullptr;
  bind(lib, "ncclGetVersion", &getVersion, path);
  getVersion(&a.version);
  if (a.version < kMinNcclVersion)
    throw Error("NCCL " + a.versionString() + " at " + path + " is too old: chorus needs 2.12 or newer");
  bind(lib, "ncclGetUniqueId", &a.getUniqueId, path);
  bind(lib, "ncclCommInitRank", &a.commInitRank, path);
  bind(lib, "ncclCommDestroy", &a.commDestroy, path);
  bind(lib, "ncclCommAbort", &a.commAbort, path);
  bind(lib, "ncclCommGetAsyncError", &a.commGetAsyncError, path);
  bind(lib, "ncclGetErrorString", &a.getErrorString, path);
  bind(lib, "ncclGetLastError", &a.getLastError, path, false);
  bind(lib, "ncclAllReduce", &a.allReduce, path);
  bind(lib, "ncclBroadcast", &a.broadcast, path);
  bind(lib, "ncclReduce", &a.reduce, path);
  bind(lib, "ncclAllGather", &a.allGather, path);
  bind(lib, "ncclReduceScatter", &a.reduceScatter, path);
  bind(lib, "ncclSend", &a.send, path);
  bind(lib, "ncclRecv", &a.recv, path);
  bind(lib, "ncclGroupStart", &a.groupStart, path);
  bind(lib, "ncclGroupEnd", &a.groupEnd, path);
  return a;
}

}  // namespace

std::string NcclApi::versionString() const {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

void NcclApi::check(int rc, const char* what, NcclComm comm) const {
  if (rc == kNcclSuccess || rc == kNcclInProgress) return;
  std::string msg = std::string(what) + " failed (NCCL " + versionString() + "): " + getErrorString(rc);
  if (getLastError) {
    const char* last = getLastError(comm);
    if (last && *last) msg += ": " + std::string(last);
  }
  throw Error(msg);
}

void setNcclSearchPath(std::vector<std::string> f) {
  std::lock_guard<std::mutex> lock(mu());
  folders() = std::move(f);
}

const NcclApi& ncclApi() {
  static std::once_flag once;
  static NcclApi api;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = openNccl();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw Error(error);
  return api;
}

int ncclVersion() {
  try {
    return ncclApi().version;
  } catch (const Error&) {
    return 0;
  }
}

int ncclDataType(DataType t) {
  switch (t) {
    case DataType::kInt8: return 0;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 2;
    case DataType::kInt64: return 4;
    case DataType::kFloat16: return 6;
    case DataType::kFloat32: return 7;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 9;
    default: return -1;
  }
}

}  // namespace chorus

namespace chorus {
int ncclBuilt() { return ncclVersion(); }
}  // namespace chorus
