#pragma once
// ZeRO-Infinity's offload to disk: arrays over this rank's partition (the fp32
// master weights and optimizer states, or stage 3's 16-bit parameter slices) kept
// in one file under nvme_path and worked on a chunk at a time in a few buffers,
// read and written through io_uring.
//
// io_uring (liburing) over libaio: libaio is asynchronous only with O_DIRECT and
// blocks in io_submit on filesystems that fall back to buffered I/O; io_uring is
// asynchronous either way, so the same code serves a raw NVMe (O_DIRECT) and a
// tmpfs or overlay folder (buffered), and one ring batches every block of a chunk.
//
// The file is unlinked as soon as it is open: it is scratch for this process
// only, never read by another run, and gone however the process ends.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct io_uring;

namespace chorus::zero {

struct NvmeConfig {
  std::string path;               // offload_*.nvme_path: a folder
  size_t chunkElems = 4u << 20;   // elements of each array per chunk
  bool pipelineRead = true;       // read chunk i+1 while chunk i is worked on
  bool pipelineWrite = true;      // write chunk i back while chunk i+1 is worked on
  size_t blockBytes = 1u << 20;   // aio.block_size: bytes per request
  unsigned queueDepth = 8;        // aio.queue_depth: requests in flight
  size_t elemBytes = 4;           // of each element (2 or 4)
};

class NvmeSwap {
 public:
  // arrays arrays of elems elements each, zero at first. `who` names the
  // owner in file names and errors. Space for the whole file is reserved here, so
  // a disk too small fails now, not in the middle of a step.
  NvmeSwap(const NvmeConfig& config, const std::string& who, size_t elems, int arrays);
  ~NvmeSwap();
  NvmeSwap(const NvmeSwap&) = delete;
  NvmeSwap& operator=(const NvmeSwap&) = delete;

  enum Access { kRead = 1, kWrite = 2, kReadWrite = 3 };
  // fn(offset, count, arrays): chunk [offset, offset + count) of [begin, end) in
  // memory, arrays[k] pointing at element `offset` of array k; with kWrite what fn
  // leaves there is written back. Chunks come in order. All writes are on disk
  // (in the page cache, for a buffered file) when this returns.
  using Fn = std::function<void(size_t offset, size_t count, char* const* arrays)>;
  void forRange(size_t begin, size_t end, Access access, const Fn& fn);

  size_t elems() const { return elems_; }
  int arrays() const { return arrays_; }
  bool direct() const { return direct_; }
  const std::string& file() const { return file_; }
  // Bytes of memory the buffers take, and of disk the file takes.
  size_t bufferBytes() const;
  size_t diskBytes() const { return stride_ * arrays_; }

 private:
  struct Slot;
  void start(Slot& s, bool write);
  void finish(Slot& s);
  void reap(bool block);
  void submit();
  void release();

  NvmeConfig cfg_;
  std::string who_, file_;
  size_t elems_ = 0, stride_ = 0;
  int arrays_ = 0, fd_ = -1;
  bool direct_ = false;
  std::unique_ptr<::io_uring> ring_;
  unsigned inflight_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace chorus::zero
