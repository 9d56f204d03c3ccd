#pragma once
// Runs a job of a fixed set of ranks to its end; the process helpers around it.
#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/supervisor.h"

namespace chorus::launcher {

struct Job {
  std::vector<RankSpec> ranks;
  bool keepGoing = false;  // survivors run on when a rank fails
  bool verbose = false;
  double killGraceSeconds = 5.0;
  std::string outputDir;  // horovodrun's --output-filename: DIR/rank.N/stdout and stderr
  int sshPort = 22;       // remote hosts' sshd, probed when a rank fails while theirs still run
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

// In a child before exec: with CHORUS_RANK_LOG_FILE set (--enable_each_rank_log),
// its output goes to that file (its folder made) instead of the launcher.
void redirectToRankLog();

// DIR/<launch time>_rank<N>.log, as DeepSpeed's launcher names them.
std::string eachRankLogFile(const std::string& dir, int rank);

// Unlinks /dev/shm/chorus-<jobId>-*; returns how many were removed.
int removeJobSegments(const std::string& jobId);

}  // namespace chorus::launcher
