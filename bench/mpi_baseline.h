#pragma once
// Open MPI measured beside chorus: rank 0 of the chorus job runs this same
// binary under mpirun (child mode) on the same sizes while the other ranks
// wait, then reads the child's timings.
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::bench {

struct MpiResult {
  std::string op;
  size_t bytes = 0;
  double timeUs = 0;
};

class MpiBaseline {
 public:
  // Runs the MPI measurement (collective over the chorus ranks). Throws when
  // chorus-bench was built without Open MPI.
  void start(Runtime& rt, int argc, char** argv);
  const MpiResult* find(const std::string& op, size_t bytes) const;

 private:
  std::vector<MpiResult> results_;
};

// Child mode (run by mpirun): measures the MPI collectives and writes JSON rows.
// Returns the process exit code.
int runMpiChild(const std::vector<std::string>& ops, const std::string& dtype, size_t lo, size_t hi, double factor,
                int warmup, int iters, bool rotate, const std::string& jsonPath);
bool builtWithMpi();

}  // namespace chorus::bench
