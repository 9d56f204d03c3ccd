#include "comm/shm/shared_pool.h"
#include "comm/communicator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace chorus {

namespace {
// Free buffers kept for reuse, and peers' buffers kept mapped. A peer's mapping
// outlives the owner's release of it until evicted here, so both are bounded.
constexpr size_t kMaxFreeBytes = size_t{512} << 20;
constexpr size_t kMaxPeerBytes = size_t{4} << 30;
constexpr size_t kMaxPeerMaps = 128;
constexpr size_t kGranule = SharedPool::kMinBytes;
}  // namespace

std::shared_ptr<SharedPool> SharedPool::instance() {
  static std::shared_ptr<SharedPool> pool(new SharedPool());
  return pool;
}

SharedPool::~SharedPool() {
  for (auto& b : free_) destroy(b);
}

void SharedPool::destroy(const Buffer& b) {
  munmap(b.base, b.bytes);
  close(b.fd);
}

std::shared_ptr<void> SharedPool::allocate(size_t bytes) {
  const size_t want = (std::max<size_t>(bytes, 1) + kGranule - 1) / kGranule * kGranule;
  Buffer b{-1, 0, 0, nullptr};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->bytes == want) {  // the oldest first: repeated ops rotate through what is free
        b = *it;
        freeBytes_ -= it->bytes;
        free_.erase(it);
        break;
      }
    }
    if (!b.base) b.id = nextId_++;
  }
  if (!b.base) {
    b.fd = memfd_create("chorus-output", MFD_CLOEXEC);
    if (b.fd < 0) return nullptr;
    void* p = MAP_FAILED;
    if (ftruncate(b.fd, static_cast<off_t>(want)) == 0)
      p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd, 0);
    if (p == MAP_FAILED) {
      close(b.fd);
      return nullptr;
    }
    b.base = static_cast<char*>(p);
    b.bytes = want;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_[reinterpret_cast<uintptr_t>(b.base)] = b;
  }
  auto self = shared_from_this();
  return std::shared_ptr<void>(b.base, [self](void* p) { self->release(static_cast<char*>(p)); });
}

void SharedPool::release(char* base) {
  std::vector<Buffer> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(base));
    if (it == live_.end()) return;
    free_.push_back(it->second);
    freeBytes_ += it->second.bytes;
    live_.erase(it);
    while (freeBytes_ > kMaxFreeBytes) {
      drop.push_back(free_.front());
      freeBytes_ -= free_.front().bytes;
      free_.pop_front();
    }
  }
  for (auto& b : drop) destroy(b);
}

bool SharedPool::describe(const void* p, size_t bytes, SharedBufferRef* ref) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(at);
  if (it == live_.begin()) return false;
  --it;
  const Buffer& b = it->second;
  if (at + bytes > it->first + b.bytes) return false;
  *ref = SharedBufferRef{static_cast<int32_t>(getpid()), b.fd, b.id, at - it->first, b.bytes};
  return true;
}

std::shared_ptr<char> SharedPool::mapPeer(const SharedBufferRef& ref) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->pid == ref.pid && it->id == ref.id) {
      peers_.splice(peers_.begin(), peers_, it);
      ++handed_;
      return it->base;
    }
  }
  // The owner keeps the buffer (and so its fd) alive while it waits in the
  // collective: this path names exactly the buffer ref describes.
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == ref.bytes)
    p = mmap(nullptr, ref.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  const size_t len = ref.bytes;
  std::shared_ptr<char> mapped(static_cast<char*>(p), [len](char* q) { munmap(q, len); });
  peers_.push_front(PeerMap{ref.pid, ref.id, ref.bytes, mapped});
  peerBytes_ += ref.bytes;
  ++handed_;
  while (peers_.size() > 1 && (peers_.size() > kMaxPeerMaps || peerBytes_ > kMaxPeerBytes)) {
    peerBytes_ -= peers_.back().bytes;
    peers_.pop_back();
  }
  return mapped;
}

size_t SharedPool::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return freeBytes_;
}

size_t SharedPool::peerMappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

uint64_t SharedPool::peerMapsHanded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handed_;
}

static_assert(SharedPool::kMinBytes == kSharedPoolMinBytes, "the interface's threshold is the pool's");
std::shared_ptr<void> allocateFromSharedPool(size_t bytes) {
  return bytes >= SharedPool::kMinBytes ? SharedPool::instance()->allocate(bytes) : nullptr;
}

}  // namespace chorus
