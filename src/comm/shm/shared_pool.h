#pragma once
// Output buffers that the ranks of one host can write into directly.
//
// Outputs that chorus allocates itself (Horovod's allgather returns a new
// tensor) come from memfd-backed mappings; a peer maps the same pages through
// /proc/<pid>/fd and writes its piece straight into them, so a shared-memory
// allgather needs no hand-over through a slot. Freed buffers are kept for reuse
// (a fresh 64 MiB mapping costs 16384 page faults; std::vector also zero-fills).
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace chorus {

// Where a buffer lies, as a peer needs it to map the buffer.
struct SharedBufferRef {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t id = 0;      // unique in the owning process; never reused
  uint64_t offset = 0;  // of the described range in the buffer
  uint64_t bytes = 0;   // of the whole buffer
};

class SharedPool : public std::enable_shared_from_this<SharedPool> {
 public:
  // Outputs from this size on come from the pool (below it, a slot hand-over is cheap).
  static constexpr size_t kMinBytes = 1 << 20;

  // The process's pool; buffers keep it alive after the runtime is gone.
  static std::shared_ptr<SharedPool> instance();

  ~SharedPool();

  // A buffer of at least bytes (contents undefined); null when the system refuses
  // (the caller allocates privately then).
  std::shared_ptr<void> allocate(size_t bytes);

  // Fills ref when [p, p + bytes) lies in one live buffer of this pool.
  bool describe(const void* p, size_t bytes, SharedBufferRef* ref) const;

  // A peer's buffer, mapped into this process (cached); null when it cannot be
  // opened (no permission to the peer's /proc entries, the peer is gone).
  // The mapping stays valid while the returned pointer lives, evicted or not.
  std::shared_ptr<char> mapPeer(const SharedBufferRef& ref);

  // Bytes held in the free list; peers' buffers kept mapped; mapPeer calls that
  // succeeded (for tests).
  size_t cachedBytes() const;
  size_t peerMappings() const;
  uint64_t peerMapsHanded() const;

 private:
  struct Buffer {
    int fd;
    uint64_t id;
    size_t bytes;
    char* base;
  };
  struct PeerMap {
    int32_t pid;
    uint64_t id;
    size_t bytes;
    std::shared_ptr<char> base;
  };
  void release(char* base);
  void destroy(const Buffer& b);

  mutable std::mutex mu_;
  uint64_t nextId_ = 1;
  std::map<uintptr_t, Buffer> live_;  // by base address
  std::list<Buffer> free_;            // most recently freed last
  size_t freeBytes_ = 0;
  std::list<PeerMap> peers_;          // most recently used first
  size_t peerBytes_ = 0;
  uint64_t handed_ = 0;
};

}  // namespace chorus
