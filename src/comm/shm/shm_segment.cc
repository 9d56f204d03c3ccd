#include "comm/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <cstring>
#include <new>
#include <random>
#include <thread>

#include "chorus/error.h"
#include "chorus/store.h"

namespace chorus {

namespace {
constexpr uint32_t kMagic = 0x63686f72;  // "chor"
constexpr int kMaxRanks = 1024;
constexpr int kCpuWords = CPU_SETSIZE / 64;

long futexWait(std::atomic<uint32_t>* addr, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Shared (not private) futex: the word lives in memory mapped by several processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futexWakeAll(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
inline void storeFence() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#endif
}
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

struct ShmSegment::Header {
  uint32_t magic;
  uint32_t size;
  uint64_t slotBytes;
  alignas(64) std::atomic<uint32_t> attached;
  std::atomic<uint32_t> failed;
  alignas(64) std::atomic<uint32_t> count;
  alignas(64) std::atomic<uint32_t> generation;
  alignas(64) std::atomic<uint32_t> sleepers;
  alignas(64) int32_t pids[kMaxRanks];
  uint64_t published[kMaxRanks];       // address of each rank's published buffer
  uint64_t publishedBytes[kMaxRanks];
  uint8_t canRead[kMaxRanks];          // start-up probe: could read the next rank's memory
  std::atomic<uint64_t> cpus[kCpuWords];  // union of the ranks' CPU affinity masks
};

namespace {
// The host's first rank failed to make the segment: the others hear it through
// the store at once instead of waiting for a name that will not come.
[[noreturn]] void failForAll(Store& store, const std::string& key, const std::string& why) {
  try {
    const std::string marked = "!" + why;
    store.set(key, std::vector<char>(marked.begin(), marked.end()));
  } catch (const std::exception&) {  // the error below is the one to report
  }
  throw Error(why);
}
}  // namespace

ShmSegment::ShmSegment(Store& store, const std::string& key, const std::string& jobId, int rank, int size,
                       size_t slotBytes, std::chrono::milliseconds connectTimeout,
                       std::chrono::milliseconds timeout, bool allowSingleCopy)
    : rank_(rank), size_(size), slotBytes_(slotBytes), stride_(((slotBytes + 63) & ~size_t{63}) + 128), timeout_(timeout) {
  if (size > kMaxRanks) throw InvalidArgument("shared memory supports at most 1024 ranks per host");
  const size_t headerBytes = (sizeof(Header) + 4095) & ~size_t{4095};
  mapBytes_ = headerBytes + 2 * static_cast<size_t>(size) * stride_;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    name_ = "/chorus-" + jobId + "-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) failForAll(store, key, "shm_open(" + name_ + ") failed: " + std::strerror(errno));
    // Reserve the pages now: a tmpfs too small would otherwise grant the size and
    // kill the first rank to touch a missing page with SIGBUS.
    const int rc = ftruncate(fd, static_cast<off_t>(mapBytes_)) != 0 ? errno
                                                                    : posix_fallocate(fd, 0, static_cast<off_t>(mapBytes_));
    if (rc != 0) {
      close(fd);
      shm_unlink(name_.c_str());
      struct statvfs vfs {};
      const std::string room = statvfs("/dev/shm", &vfs) == 0
                                   ? std::to_string(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) + " bytes free"
                                   : "its free space unknown";
      failForAll(store, key,
                 "shared memory: " + std::to_string(mapBytes_) + " bytes for " + std::to_string(size) +
                     " ranks on this host do not fit in /dev/shm (" + room + "; " + std::strerror(rc) +
                     "): enlarge it (docker run --shm-size=1g, or mount -o remount,size=1G /dev/shm), lower "
                     "CHORUS_SHM_SLOT_BYTES, or set CHORUS_SHM_DISABLE=1 to use TCP between local ranks");
    }
  }
  if (rank == 0) {
    base_ = mmap(nullptr, mapBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base_ == MAP_FAILED) {
      shm_unlink(name_.c_str());
      throw Error("mmap of shared memory failed: " + std::string(std::strerror(errno)));
    }
    header_ = static_cast<Header*>(base_);
    new (header_) Header();
    header_->magic = kMagic;
    header_->size = static_cast<uint32_t>(size);
    header_->slotBytes = slotBytes_;
    header_->pids[0] = getpid();
    const bool last = header_->attached.fetch_add(1) + 1 == static_cast<uint32_t>(size);
    store.set(key, std::vector<char>(name_.begin(), name_.end()));
    if (last) shm_unlink(name_.c_str());
  } else {
    auto v = store.get(key, connectTimeout);
    name_.assign(v.begin(), v.end());
    if (!name_.empty() && name_[0] == '!') throw Error(name_.substr(1) + " (found by this host's first rank)");
    fd = shm_open(name_.c_str(), O_RDWR, 0600);
    if (fd < 0) throw Error("shm_open(" + name_ + ") failed: " + std::strerror(errno));
    base_ = mmap(nullptr, mapBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base_ == MAP_FAILED) throw Error("mmap of shared memory failed: " + std::string(std::strerror(errno)));
    header_ = static_cast<Header*>(base_);
    if (header_->magic != kMagic || header_->size != static_cast<uint32_t>(size) ||
        header_->slotBytes != slotBytes_) {
      throw Error("shared memory segment " + name_ + " does not match this process set");
    }
    header_->pids[rank] = getpid();
    if (header_->attached.fetch_add(1) + 1 == static_cast<uint32_t>(size)) shm_unlink(name_.c_str());
  }
  data_ = static_cast<char*>(base_) + headerBytes;
  // A barrier spins (yielding the core after 2 us) before it sleeps: longer when
  // every rank has a core of its own. The limit is time, not iterations: a pause
  // instruction takes 10-140 cycles depending on the CPU. A peer later than this
  // is better waited for asleep (an idle rank must not burn its core).
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto judge = [&] {
    oversubscribed_ = static_cast<unsigned>(size) > cores;
    spinMicros_ = oversubscribed_ ? 20 : 50;
  };
  judge();  // (for the barrier below)
  // The cores the ranks may run on are those of their affinity masks (taskset,
  // a cpuset, a launcher's binding), not the machine's: 2 ranks confined to one
  // core that spin as if each had its own took 9-11 us per small op against 3.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mine)) header_->cpus[c / 64].fetch_or(uint64_t{1} << (c % 64));
  }
  // Everyone attached (and the name is gone) before the first collective.
  barrier();
  unsigned allowed = 0;
  for (int w = 0; w < kCpuWords; ++w) allowed += static_cast<unsigned>(__builtin_popcountll(header_->cpus[w].load()));
  if (allowed > 0) cores = std::min(cores, allowed);
  judge();
  // Probe cross-memory attach once: each rank reads the next rank's pid word.
  publish(&header_->pids[rank_], sizeof(int32_t));
  barrier();
  int32_t probe = 0;
  try {
    readPublished((rank_ + 1) % size_, 0, &probe, sizeof(probe));
    header_->canRead[rank_] = probe == header_->pids[(rank_ + 1) % size_];
  } catch (const Error&) {
    header_->canRead[rank_] = 0;
  }
  barrier();
  singleCopy_ = allowSingleCopy;
  for (int r = 0; r < size_; ++r) singleCopy_ = singleCopy_ && header_->canRead[r];
  barrier();
}

void ShmSegment::publish(const void* ptr, size_t bytes) {
  header_->published[rank_] = reinterpret_cast<uint64_t>(ptr);
  header_->publishedBytes[rank_] = bytes;
}

void ShmSegment::readPublished(int r, size_t offset, void* dst, size_t len) {
  char* out = static_cast<char*>(dst);
  uint64_t from = header_->published[r] + offset;
  while (len > 0) {
    iovec local{out, len};
    iovec remote{reinterpret_cast<void*>(from), len};
    ssize_t got = process_vm_readv(header_->pids[r], &local, 1, &remote, 1, 0);
    if (got <= 0) {
      throw PeerFailure("peer failure: cannot read rank " + std::to_string(r) + "'s memory: " +
                        std::strerror(errno));
    }
    out += got;
    from += static_cast<uint64_t>(got);
    len -= static_cast<size_t>(got);
  }
}

ShmSegment::~ShmSegment() {
  if (base_ && base_ != MAP_FAILED) munmap(base_, mapBytes_);
}

char* ShmSegment::slot(int bank, int r) const {
  return data_ + (static_cast<size_t>(bank) * size_ + r) * stride_;
}

uint64_t* ShmSegment::slotNote(int bank, int r) const {
  return reinterpret_cast<uint64_t*>(slot(bank, r) + stride_ - 64);
}

void ShmSegment::fail(const std::string& why, bool timeout) {
  header_->failed.store(1);
  futexWakeAll(&header_->generation);
  if (timeout) throw Timeout(why);
  throw PeerFailure(why);
}

void ShmSegment::abort() {
  header_->failed.store(1);
  futexWakeAll(&header_->generation);
}

void ShmSegment::checkPeers() {
  if (header_->failed.load()) throw PeerFailure("peer failure: another rank of this host's process set failed");
  for (int r = 0; r < size_; ++r) {
    const pid_t pid = header_->pids[r];
    if (pid > 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH) {
      fail("peer failure: rank " + std::to_string(r) + " of the process set (pid " + std::to_string(pid) +
               ") has died",
           false);
    }
  }
}

void ShmSegment::barrier() {
  // Everything written before a barrier is visible to the ranks after it,
  // non-temporal stores to the slots included (they are weakly ordered).
  storeFence();
  const uint32_t gen = header_->generation.load(std::memory_order_acquire);
  if (header_->count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    header_->count.store(0, std::memory_order_relaxed);
    header_->generation.fetch_add(1, std::memory_order_release);
    if (header_->sleepers.load(std::memory_order_acquire)) futexWakeAll(&header_->generation);
    return;
  }
  waitForGeneration(gen);
}

void ShmSegment::waitForGeneration(uint32_t gen) {
  // Pure spinning first; then each round of spinning yields the core, in case the
  // late peer is waiting for this very core (the scheduler may stack ranks).
  // With more ranks than cores a late peer most likely is: yield at every turn
  // (4 ranks on 2 cores, 8 B allreduce: 18-26 against 32-38 us per op).
  const auto start = std::chrono::steady_clock::now();
  const auto yieldFrom = start + std::chrono::microseconds(oversubscribed_ ? 0 : 2),
             spinUntil = start + std::chrono::microseconds(spinMicros_);
  const int round = oversubscribed_ ? 1 : 64;
  for (int i = 1;; ++i) {
    if (header_->generation.load(std::memory_order_acquire) != gen) return;
    cpuRelax();
    if (i % round == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now > spinUntil) break;
      if (now > yieldFrom) sched_yield();
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (header_->generation.load(std::memory_order_acquire) == gen) {
    header_->sleepers.fetch_add(1, std::memory_order_acq_rel);
    futexWait(&header_->generation, gen, 50'000'000);  // wake up now and then to check on peers
    header_->sleepers.fetch_sub(1, std::memory_order_acq_rel);
    if (header_->generation.load(std::memory_order_acquire) != gen) return;
    checkPeers();
    if (std::chrono::steady_clock::now() > deadline) {
      fail("timed out after " + std::to_string(timeout_.count()) +
               " ms waiting for the other ranks of this host in a shared-memory collective",
           true);
    }
  }
}

}  // namespace chorus
