#pragma once
// Which process set each collective name is in flight on, on this rank. A name
// may be in flight on one set at a time; that rule turns "rank A submitted a name
// on one set, rank B on another" into a certain deadlock that a controller can
// see from its own negotiation table, and then turn into an error on both sets
// (by posting a conflict marker to each, see Controller::cycle).
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus {

class NameRegistry {
 public:
  // Claims name for setId; returns -1, or the set the name is in flight on already.
  int32_t claim(const std::string& name, int32_t setId);
  void release(const std::string& name, int32_t setId);
  int32_t setOf(const std::string& name) const;  // -1: not in flight

  // What a set's negotiation waits for: pending names and their missing global ranks.
  void publishMissing(int32_t setId, std::map<std::string, std::vector<int>> missing);
  std::vector<int> missing(int32_t setId, const std::string& name) const;

  // Controllers register their set's members while they live (only sets this rank is in).
  void setMembers(int32_t setId, const std::vector<int>& globalRanks);
  void forgetSet(int32_t setId);
  // Conflicts need two sets on this rank; with one, the controllers skip detection.
  bool severalSets() const;
  bool isMember(int32_t setId, int globalRank) const;

  // Queues a conflict marker for a set's controller to send in its next cycle;
  // false (nothing queued) when this rank already sent one there for this use of
  // the name (a fresh claim of the name starts a new use).
  bool postMarker(int32_t toSet, const std::string& name, int32_t conflictSet);
  std::vector<std::pair<std::string, int32_t>> takeMarkers(int32_t setId);

 private:
  mutable std::mutex mu_;
  std::atomic<int> sets_{0};    // members_.size(), read without the lock
  std::atomic<int> queued_{0};  // markers queued for any set, read without the lock
  std::unordered_map<std::string, int32_t> inFlight_;
  std::map<int32_t, std::vector<int>> members_;
  std::map<int32_t, std::map<std::string, std::vector<int>>> missing_;
  std::map<int32_t, std::vector<std::pair<std::string, int32_t>>> markers_;
  std::map<std::string, std::vector<int32_t>> marked_;  // sets a marker went to, per name
};

}  // namespace chorus
