#pragma once
// Starts the ranks of a job on this host, tags their output, and watches them.
#include <map>
#include <string>
#include <vector>

namespace chorus::launcher {

struct LocalJob {
  std::vector<std::string> command;
  // Per rank: the environment variables that identify it.
  std::vector<std::map<std::string, std::string>> rankEnv;
  // Per rank: the CPUs it runs on (empty: unbound).
  std::vector<std::vector<int>> rankCpus;
  bool keepGoing = false;  // survivors run on when a rank fails
  bool verbose = false;
  double killGraceSeconds = 5.0;
};

// Runs the job to the end. Returns 0 when every rank exited 0; otherwise the
// first failure's exit code (128+signal for a signal). Ctrl-C stops every rank.
int runLocalJob(const LocalJob& job);

// Hands the job to mpirun: the ranks then learn their ranks and hosts from MPI
// and meet through a store that rank 0 serves. Returns mpirun's exit code.
int runWithMpirun(int np, const std::string& hosts, const std::string& hostfile, const std::string& mpiArgs,
                  const std::vector<std::string>& command, bool verbose);

// Unlinks /dev/shm/chorus-<jobId>-*; returns how many were removed.
int removeJobSegments(const std::string& jobId);

}  // namespace chorus::launcher
