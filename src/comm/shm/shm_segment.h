#pragma once
// A shared-memory segment for the ranks of one host: a header with a barrier and
// the ranks' pids, then two banks of one slot per rank (double buffering).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus {

class Store;

class ShmSegment {
 public:
  // Set rank 0 creates the segment and publishes its name in the store under
  // `key`; the others attach. The last to attach unlinks the name, so nothing is
  // left in /dev/shm once every rank holds a mapping.
  ShmSegment(Store& store, const std::string& key, const std::string& jobId, int rank, int size,
             size_t slotBytes, std::chrono::milliseconds connectTimeout, std::chrono::milliseconds timeout,
             bool allowSingleCopy = true);
  ~ShmSegment();
  // Marks the segment failed and wakes every waiter: they throw PeerFailure.
  void abort();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  // More ranks than the cores their affinity masks allow together: a waiting
  // rank then yields its core at once.
  bool oversubscribed() const { return oversubscribed_; }
  // A slot starts at a line boundary and has 63 bytes to spare after slotBytes,
  // so that its data may start at any offset within its first line.
  char* slot(int bank, int rank) const;
  // A line of the slot's own after it, for what its owner says about the data.
  uint64_t* slotNote(int bank, int rank) const;

  // Every rank must call it, in the same order; what a rank wrote before it
  // (streamed stores too) is visible to all after it. Spins briefly, then sleeps on a
  // futex. Throws PeerFailure when a peer died or failed, Timeout after the timeout.
  void barrier();

  // Whether the direct paths may reach the other ranks' buffers: allowed, and
  // every rank could read every other's memory at start-up (same user, no
  // ptrace ban; opening a peer's pool buffer through /proc needs the same).
  bool singleCopy() const { return singleCopy_; }

 private:
  // The start-up probe (cross-memory attach): a rank publishes a buffer of its
  // own memory, and another reads it. readPublished throws PeerFailure.
  void publish(const void* ptr, size_t bytes);
  void readPublished(int r, size_t offset, void* dst, size_t len);
  struct Header;
  void waitForGeneration(uint32_t gen);
  void checkPeers();
  [[noreturn]] void fail(const std::string& why, bool timeout);

  int rank_, size_;
  size_t slotBytes_;
  size_t stride_;  // slot to slot: slotBytes rounded up to a line, the spare line, the note's line
  size_t mapBytes_ = 0;
  void* base_ = nullptr;
  Header* header_ = nullptr;
  char* data_ = nullptr;
  std::string name_;
  std::chrono::milliseconds timeout_;
  int spinMicros_;  // spin this long in a barrier before sleeping on the futex
  bool oversubscribed_ = false;  // more ranks than cores: yield at once
  bool singleCopy_ = false;
};

}  // namespace chorus
