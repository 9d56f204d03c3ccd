#pragma once
// Starts the ranks of a job (on this host, or through ssh on others), tags
// their output, and watches them.
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace chorus::launcher {

struct Job {
  std::vector<std::string> command;
  // Per rank, where it is not command itself: ssh and the agent for a remote rank.
  std::vector<std::vector<std::string>> rankArgv;
  // Per rank: written to its standard input, which then stays open until the rank
  // ends or is stopped (a remote rank's agent reads its environment from it).
  std::vector<std::string> rankInput;
  // Per rank: the host it runs on, for messages ("" for this host).
  std::vector<std::string> rankHost;
  // horovodrun's --output-filename: DIR/rank.N/stdout and stderr, beside the terminal.
  std::string outputDir;
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
int runJob(const Job& job);

// Runs argv (mpirun) in the foreground and returns its exit code; it forwards
// Ctrl-C to its ranks itself.
int runForeground(const std::vector<std::string>& argv, bool verbose);

// In a child before exec: SIGTERM when the launcher (parent) dies, even by
// SIGKILL, so that no rank outlives it; exits at once if it is already gone.
void stopWithParent(pid_t parent);

// Unlinks /dev/shm/chorus-<jobId>-*; returns how many were removed.
int removeJobSegments(const std::string& jobId);

}  // namespace chorus::launcher
