#pragma once
// Open MPI measured beside chorus: rank 0 of the chorus job runs this same
// binary under mpirun (child mode) on the same sizes while the other ranks
// wait, then reads the child's timings.
#include <algorithm>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::bench {

// The median of one size's rounds.
inline double medianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// Buffer sets a size rotates through (about 64 MiB in all, so that caches do not
// flatter anyone); chorus and the MPI child must agree on it.
inline int bufferSets(size_t bytes, bool rotate) {
  return rotate ? static_cast<int>(std::clamp<size_t>((64u << 20) / std::max<size_t>(bytes, 1), 1, 64)) : 1;
}

struct MpiResult {
  std::string op;
  size_t bytes = 0;
  std::vector<double> roundsUs;  // one mean per round
  double timeUs() const { return medianOf(roundsUs); }
};

// What the MPI child measures: one collective at one size.
struct MpiCase {
  std::string op;
  size_t bytes;
  std::string dtype;
  int warmup, iters;
  bool rotate;
};

class MpiBaseline {
 public:
  // Measures one case once (collective over the chorus ranks: rank 0 runs the
  // child, the others wait); rounds of a case accumulate. Throws when
  // chorus-bench was built without Open MPI.
  void measure(Runtime& rt, const std::string& self, const MpiCase& c);
  const MpiResult* find(const std::string& op, size_t bytes) const;

 private:
  std::vector<MpiResult> results_;
  bool announced_ = false;
};

// Child mode (run by mpirun): measures the MPI collectives and writes JSON rows.
// Returns the process exit code.
int runMpiChild(const std::vector<std::string>& ops, const std::string& dtype, size_t lo, size_t hi, double factor,
                int warmup, int iters, bool rotate, const std::string& jsonPath);
bool builtWithMpi();
// Throws InvalidArgument when chorus-bench was built without Open MPI.
void requireMpi();

}  // namespace chorus::bench
