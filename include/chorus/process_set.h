#pragma once
// A process set: a named subset of the global ranks that runs its own collectives.
#include <cstdint>
#include <vector>

namespace chorus {

class ProcessSet {
 public:
  ProcessSet() = default;
  ProcessSet(int32_t id, std::vector<int> ranks, int globalRank);

  int32_t id() const { return id_; }
  const std::vector<int>& ranks() const { return ranks_; }
  bool included() const { return rankInSet_ >= 0; }
  // This process's rank within the set, -1 when not included.
  int rank() const { return rankInSet_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  bool valid() const { return id_ >= 0; }

 private:
  int32_t id_ = -1;
  std::vector<int> ranks_;
  int rankInSet_ = -1;
};

inline constexpr int32_t kGlobalProcessSetId = 0;

}  // namespace chorus
