#pragma once
// Horovod's response cache: a response negotiated once is remembered at a bit
// position that is the same on every rank (every rank inserts, touches and
// evicts in the same order), so a repeated request costs one bit in the
// cycle's bit-vector allreduce instead of a trip through the coordinator.
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace chorus {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  enum class Lookup { kMiss, kHit, kStale };
  // kStale: the name is cached but this rank now asks with other parameters.
  Lookup lookup(const Request& req, int* pos) const;
  // Inserts or refreshes; evicts the least recently used entry when full and
  // returns its position (-1 when nothing was evicted).
  int put(const Response& resp, const Request& mine);
  const Response& response(int pos) const { return slots_[pos].response; }
  void touch(int pos);
  void erase(int pos);
  int capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0 && !off_; }
  // Off: forgets every entry and caches nothing until on again (autotune; every
  // rank switches at the same cycle, so positions stay the same everywhere).
  void setEnabled(bool on);

 private:
  struct Slot {
    bool used = false;
    Response response;
    Request request;
    std::list<int>::iterator lru;
  };
  int capacity_;
  bool off_ = false;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> byName_;
  std::list<int> lru_;  // front: most recently used
  std::vector<int> free_;
};

}  // namespace chorus
