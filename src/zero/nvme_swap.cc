#include "zero/nvme_swap.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "chorus/error.h"

namespace chorus::zero {

namespace {

constexpr size_t kAlign = 4096;  // O_DIRECT: offsets, lengths and addresses in whole blocks

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
size_t alignDown(size_t n) { return n / kAlign * kAlign; }

}  // namespace

// One buffer per array for one chunk, and the requests in flight on it.
struct NvmeSwap::Slot {
  struct Req {
    Slot* slot;
    char* buf;
    size_t len;
    uint64_t off;
    bool write;
  };
  std::vector<char*> bufs;
  size_t winStart = 0, winBytes = 0;  // bytes within each array
  std::vector<Req> reqs;
  size_t pending = 0;
  std::string error;
};

NvmeSwap::NvmeSwap(const NvmeConfig& config, const std::string& who, size_t elems, int arrays)
    : cfg_(config), who_(who), elems_(elems), arrays_(arrays) {
  if (arrays_ < 1 || arrays_ > 3) throw InvalidArgument("ZeRO engine: nvme offload holds 1-3 arrays");
  if (cfg_.path.empty())
    throw InvalidArgument("ZeRO engine: offload to nvme needs 'nvme_path', a folder on the disk to offload to");
  if (cfg_.elemBytes != 2 && cfg_.elemBytes != 4) throw InvalidArgument("ZeRO engine: nvme offload of 2- or 4-byte elements");
  const size_t kAlignElems = kAlign / cfg_.elemBytes;
  cfg_.chunkElems = std::max(kAlignElems, (cfg_.chunkElems + kAlignElems - 1) / kAlignElems * kAlignElems);
  cfg_.blockBytes = std::clamp(alignUp(cfg_.blockBytes), kAlign, size_t{1} << 30);  // (a request's length is 32-bit)
  cfg_.queueDepth = std::max(1u, cfg_.queueDepth);
  stride_ = alignUp(std::max<size_t>(elems_, 1) * cfg_.elemBytes);
  std::error_code ec;
  std::filesystem::create_directories(cfg_.path, ec);
  if (ec)
    throw Error("ZeRO engine: cannot create the nvme_path folder '" + cfg_.path + "': " + ec.message());
  std::string name = (std::filesystem::path(cfg_.path) / ("chorus-swap-" + who_ + "-XXXXXX")).string();
  const int tmpFd = ::mkostemp(name.data(), O_CLOEXEC);
  if (tmpFd < 0)
    throw Error("ZeRO engine: cannot create a swap file in nvme_path '" + cfg_.path + "': " + std::strerror(errno));
  file_ = name;
  try {
    // Reserved through the plain descriptor (glibc's emulation, where a filesystem has no
    // fallocate, writes through it, which O_DIRECT would refuse).
    const int rc = ::posix_fallocate(tmpFd, 0, static_cast<off_t>(diskBytes()));
    if (rc != 0)
      throw Error("ZeRO engine: cannot reserve " + std::to_string(diskBytes()) + " bytes for " + who_ +
                  "'s offloaded state in nvme_path '" + cfg_.path + "': " + std::strerror(rc));
    // O_DIRECT where the filesystem has it (a real disk: no page cache in between); else buffered.
    fd_ = ::open(name.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd_ >= 0) {
      direct_ = true;
      ::close(tmpFd);
    } else {
      fd_ = tmpFd;
    }
    ::unlink(name.c_str());
    ring_ = std::make_unique<::io_uring>();
    const int qrc = io_uring_queue_init(cfg_.queueDepth, ring_.get(), 0);
    if (qrc < 0) {
      ring_.reset();
      throw Error(std::string("ZeRO engine: offload to nvme needs io_uring, which this kernel or its seccomp policy "
                              "refuses (") + std::strerror(-qrc) + "); use offload device \"cpu\"");
    }
    // Three tiles (read ahead, stepped, written behind), fewer when the whole partition is fewer.
    const size_t tiles = (elems_ + cfg_.chunkElems - 1) / cfg_.chunkElems;
    const size_t bufBytes = cfg_.chunkElems * cfg_.elemBytes + kAlign;
    for (size_t n = 0; n < std::clamp<size_t>(tiles, 1, 3); ++n) {
      auto slot = std::make_unique<Slot>();
      for (int k = 0; k < arrays_; ++k) {
        void* p = std::aligned_alloc(kAlign, bufBytes);
        if (!p) throw Error("ZeRO engine: cannot allocate the nvme offload's buffers");
        slot->bufs.push_back(static_cast<char*>(p));
      }
      slots_.push_back(std::move(slot));
    }
  } catch (...) {
    if (fd_ < 0) {
      ::close(tmpFd);
      ::unlink(name.c_str());
    }
    release();
    throw;
  }
}

void NvmeSwap::release() {
  if (ring_) io_uring_queue_exit(ring_.get());
  ring_.reset();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  for (auto& s : slots_)
    for (char* b : s->bufs) std::free(b);
  slots_.clear();
}

NvmeSwap::~NvmeSwap() {
  try {
    while (inflight_ > 0) reap(true);
  } catch (...) {
  }
  release();
}

size_t NvmeSwap::bufferBytes() const { return slots_.size() * arrays_ * (cfg_.chunkElems * cfg_.elemBytes + kAlign); }

void NvmeSwap::start(Slot& s, bool write) {
  s.error.clear();
  s.reqs.clear();
  for (int k = 0; k < arrays_; ++k)
    for (size_t at = 0; at < s.winBytes; at += cfg_.blockBytes)
      s.reqs.push_back({&s, s.bufs[k] + at, std::min(cfg_.blockBytes, s.winBytes - at),
                        static_cast<uint64_t>(k) * stride_ + s.winStart + at, write});
  // (reqs is not resized again until this slot is finished: the ring holds pointers into it)
  for (auto& r : s.reqs) {
    while (inflight_ >= cfg_.queueDepth) {  // (below the depth the ring always has a free entry)
      submit();
      reap(true);
    }
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (!sqe) {
      submit();
      sqe = io_uring_get_sqe(ring_.get());
    }
    if (r.write)
      io_uring_prep_write(sqe, fd_, r.buf, static_cast<unsigned>(r.len), r.off);
    else
      io_uring_prep_read(sqe, fd_, r.buf, static_cast<unsigned>(r.len), r.off);
    io_uring_sqe_set_data(sqe, &r);
    ++inflight_;
    ++s.pending;
  }
  submit();
}

void NvmeSwap::submit() {
  for (;;) {
    const int rc = io_uring_submit(ring_.get());
    if (rc >= 0) return;
    if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
      throw Error("ZeRO engine: nvme offload: io_uring cannot submit (" + std::string(std::strerror(-rc)) + ")");
    if (rc != -EINTR && inflight_ > 0) reap(true);  // (busy: let completions drain first)
  }
}

void NvmeSwap::reap(bool block) {
  io_uring_cqe* cqe = nullptr;
  const int rc = block ? io_uring_wait_cqe(ring_.get(), &cqe) : io_uring_peek_cqe(ring_.get(), &cqe);
  if (rc == -EINTR || rc == -EAGAIN) return;
  if (rc < 0) throw Error(std::string("ZeRO engine: nvme offload: io_uring wait failed: ") + std::strerror(-rc));
  if (!cqe) return;
  auto* r = static_cast<Slot::Req*>(io_uring_cqe_get_data(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(ring_.get(), cqe);
  --inflight_;
  if (!r) return;
  Slot& s = *r->slot;
  if (res < 0 || (res == 0 && r->len > 0)) {
    if (s.error.empty())
      s.error = std::string(r->write ? "cannot write " : "cannot read ") + std::to_string(r->len) +
                " bytes at offset " + std::to_string(r->off) + ": " + (res < 0 ? std::strerror(-res) : "end of file");
    --s.pending;
    return;
  }
  if (static_cast<size_t>(res) < r->len) {  // a short transfer: the rest goes again
    r->buf += res;
    r->off += static_cast<uint64_t>(res);
    r->len -= static_cast<size_t>(res);
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (!sqe) {
      submit();
      sqe = io_uring_get_sqe(ring_.get());
    }
    if (r->write)
      io_uring_prep_write(sqe, fd_, r->buf, static_cast<unsigned>(r->len), r->off);
    else
      io_uring_prep_read(sqe, fd_, r->buf, static_cast<unsigned>(r->len), r->off);
    io_uring_sqe_set_data(sqe, r);
    ++inflight_;
    submit();
    return;
  }
  --s.pending;
}

void NvmeSwap::finish(Slot& s) {
  while (s.pending > 0) reap(true);
  if (!s.error.empty()) {
    std::string why = std::move(s.error);
    s.error.clear();
    throw Error("ZeRO engine: " + who_ + "'s offloaded state in nvme_path '" + cfg_.path + "': " + why +
                "; the step did not complete");
  }
}

void NvmeSwap::forRange(size_t begin, size_t end, Access access, const Fn& fn) {
  if (end > elems_ || begin > end)
    throw InvalidArgument("ZeRO engine: nvme offload range [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") outside " + std::to_string(elems_) + " elements");
  if (begin == end) return;
  const size_t eb = cfg_.elemBytes, kAlignElems = kAlign / eb;
  // Writing part of a block means reading the rest of it first.
  const bool edgeOpen = begin % kAlignElems != 0 || (end % kAlignElems != 0 && end != elems_);
  const bool reads = (access & kRead) || edgeOpen, writes = access & kWrite;
  std::vector<std::pair<size_t, size_t>> chunks;  // later chunks start on whole blocks
  for (size_t at = begin; at < end;) {
    const size_t next = std::min(end, (at / kAlignElems) * kAlignElems + cfg_.chunkElems);
    chunks.emplace_back(at, next - at);
    at = next;
  }
  auto place = [&](Slot& s, size_t i) {
    s.winStart = alignDown(chunks[i].first * eb);
    s.winBytes = alignUp((chunks[i].first + chunks[i].second) * eb) - s.winStart;
  };
  auto slot = [&](size_t i) -> Slot& { return *slots_[i % slots_.size()]; };
  try {
    if (reads) {
      place(slot(0), 0);
      start(slot(0), false);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      Slot& s = slot(i);
      if (reads) {
        finish(s);
      } else {
        finish(s);  // (its earlier write)
        place(s, i);
      }
      if (reads && i + 1 < chunks.size()) {
        Slot& n = slot(i + 1);
        finish(n);  // its last write is on disk before it is read into again
        place(n, i + 1);
        if (cfg_.pipelineRead) start(n, false);
      }
      char* ptrs[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < arrays_; ++k) ptrs[k] = s.bufs[k] + (chunks[i].first * eb - s.winStart);
      fn(chunks[i].first, chunks[i].second, ptrs);
      if (writes) {
        start(s, true);
        if (!cfg_.pipelineWrite) finish(s);
      }
      if (reads && !cfg_.pipelineRead && i + 1 < chunks.size()) start(slot(i + 1), false);
    }
    for (auto& s : slots_) finish(*s);
  } catch (...) {
    while (inflight_ > 0) reap(true);  // (nothing in flight into a buffer after this)
    for (auto& s : slots_) {
      s->pending = 0;
      s->error.clear();
    }
    throw;
  }
}

}  // namespace chorus::zero
