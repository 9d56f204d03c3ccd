#include <algorithm>

#include "chorus/chorus.h"
#include "comm/communicator.h"

namespace chorus {

// The facade's one instance; everything else takes a Runtime explicitly.
Runtime& defaultRuntime() {
  static Runtime* instance = new Runtime();  // never destroyed: threads may outlive statics
  return *instance;
}

// Memory for outputs (the executor's, hvd.allreduce's new tensors): large
// buffers from the shared pool, else the heap.
static_assert(kSharedPoolMinBytes == kSharedMinBytes, "the public threshold is the pool's");
std::shared_ptr<void> allocateShared(size_t bytes) {
  std::shared_ptr<void> buf = allocateFromSharedPool(bytes);
  if (!buf) buf = std::shared_ptr<char[]>(new char[std::max<size_t>(bytes, 1)]);
  return buf;
}

}  // namespace chorus
