#pragma once
// NCCL, opened with dlopen: the library named by CHORUS_NCCL_LIBRARY, else
// libnccl.so.2 in the folders the frontend found (torch's nvidia/nccl/lib on
// sys.path), else the loader's path. The few types chorus uses are declared
// here (NCCL's ABI), so libchorus builds without NCCL's headers.
#include <cstddef>
#include <string>
#include <vector>

#include "chorus/types.h"

namespace chorus {

// Oldest NCCL chorus runs with: ncclAvg (2.10) and ncclCommGetAsyncError's
// nonblocking abort semantics it relies on.
inline constexpr int kMinNcclVersion = 21200;

struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct ncclComm*;
enum NcclResult : int { kNcclSuccess = 0, kNcclInProgress = 7 };
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };

struct NcclApi {
  std::string path;  // the library opened
  int version = 0;   // e.g. 22809 for 2.28.9
  int (*getUniqueId)(NcclUniqueId*);
  int (*commInitRank)(NcclComm*, int, NcclUniqueId, int);
  int (*commDestroy)(NcclComm);
  int (*commAbort)(NcclComm);
  int (*commGetAsyncError)(NcclComm, int*);
  const char* (*getErrorString)(int);
  const char* (*getLastError)(NcclComm);  // may be null (NCCL < 2.13)
  int (*allReduce)(const void*, void*, size_t, int, int, NcclComm, void*);
  int (*broadcast)(const void*, void*, size_t, int, int, NcclComm, void*);
  int (*reduce)(const void*, void*, size_t, int, int, int, NcclComm, void*);
  int (*allGather)(const void*, void*, size_t, int, NcclComm, void*);
  int (*reduceScatter)(const void*, void*, size_t, int, int, NcclComm, void*);
  int (*send)(const void*, size_t, int, int, NcclComm, void*);
  int (*recv)(void*, size_t, int, int, NcclComm, void*);
  int (*groupStart)();
  int (*groupEnd)();

  // "2.28.9".
  std::string versionString() const;
  // Throws chorus::Error naming the call, the NCCL version and NCCL's message.
  void check(int rc, const char* what, NcclComm comm = nullptr) const;
};

// Folders to look in for libnccl.so.2 after CHORUS_NCCL_LIBRARY (the Python
// frontend adds torch's nvidia/nccl/lib folders of sys.path at import).
void setNcclSearchPath(std::vector<std::string> folders);

// NCCL, opened once per process; throws chorus::Error saying what was tried.
const NcclApi& ncclApi();
// Whether NCCL can be opened (no exception); its version or 0.
int ncclVersion();

// NCCL's data type for a chorus dtype; -1 where NCCL has none (int16, uint16,
// bool travel as bytes where the op allows it).
int ncclDataType(DataType t);

}  // namespace chorus
