#pragma once
// From chorusrun's options to a running job: which host each rank runs on,
// where the store listens, each rank's environment, how remote ranks start.
#include <map>
#include <string>
#include <vector>

#include "launcher/remote.h"
#include "launcher/supervisor.h"
#include "base/net_address.h"

namespace chorus::launcher {

struct LaunchOptions {
  int np = 0;
  std::string hosts, hostfile;  // -H, --hostfile
  bool useMpi = false;
  double startTimeout = 30;
  bool verbose = false, keepGoing = false;
  std::string jobId, mpiArgs, bindTo = "none";
  SshOptions ssh;
  std::vector<std::string> exports;  // -x NAME[=VALUE]
  std::string networkInterface, networkPrefix, outputDir;
  // DeepSpeed's launcher: --num_nodes, --num_gpus/--num_procs, --include,
  // --exclude, --master_addr, --master_port, --no_python, --module.
  int numNodes = -1, numProcs = -1;
  std::string include, exclude, masterAddr;
  int masterPort = 0;  // torch.distributed's MASTER_PORT (default: a free port)
  int storePort = 0;   // chorus's store (default: a free port)
  bool noPython = false, module = false;
  // Started as `deepspeed`: the script gets --local_rank=N unless --no_local_rank.
  bool deepspeedForm = false, noLocalRank = false;
  std::string eachRankLog;  // --enable_each_rank_log DIR
  std::string python;       // --python: the interpreter for .py scripts
  std::vector<std::string> command;
};

// Runs the job to its end; returns chorusrun's exit code. Throws
// std::invalid_argument (and chorus::Error) on bad options, before anything starts.
int launch(LaunchOptions opts);

// The command to run: a .py script under the current Python, as DeepSpeed's launcher does.
std::vector<std::string> resolveCommand(const LaunchOptions& o);
// One rank's command: DeepSpeed's launcher puts --local_rank=N right after the script.
std::vector<std::string> rankCommand(const LaunchOptions& o, const std::vector<std::string>& command, int localRank);
// What torch.distributed gets in every rank of a job (MASTER_ADDR, MASTER_PORT):
// rank 0's host as the others reach it, and a port free there. A port chorusrun
// chooses is held in *held until the job ends (see net::HeldPort), so that
// nothing else takes it before rank 0's torch.distributed listens on it; that
// guard covers rank 0 on this host (a remote rank 0 gets a port outside the
// ephemeral range, chosen here).
std::map<std::string, std::string> torchEnvironment(const LaunchOptions& o, const std::string& storeAddr,
                                                    const std::string& rank0Host, bool rank0Local,
                                                    net::HeldPort* held);
// Where the store listens (see docs/launching.md); remote: the hosts other than this one.
std::string storeAddress(const LaunchOptions& o, const std::vector<std::string>& remote);
// --python, else the interpreter behind the `chorusrun` console script
// (CHORUS_PYTHON), else the one chorus was built with, else python3.
std::string pythonForScripts(const LaunchOptions& o);
std::string selfPath();    // this chorusrun, which remote hosts run as the rank agent
std::string currentDir();  // where remote ranks start

// The variables that tell a rank who it is (CHORUS_*, HOROVOD_*, and RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE
// as torch.distributed and DeepSpeed's launcher set them).
std::map<std::string, std::string> rankEnvironment(int rank, int size, int localRank, int localSize, int crossRank,
                                                   int crossSize);

// What every rank of a job gets besides who it is: the store, the secret, the
// start timeout, the job id, the network interface.
std::map<std::string, std::string> jobEnvironment(const LaunchOptions& o, const std::string& storeAddr, int storePort,
                                                  const std::string& secret);

// One rank's process: on this host the command itself (env set, -x NAME=VALUE
// applied); elsewhere ssh to chorusrun's agent, which reads env and the
// forwarded variables from its input.
RankSpec rankSpec(const LaunchOptions& o, const SshOptions& ssh, const std::string& host, bool local,
                  const std::vector<std::string>& command, std::map<std::string, std::string> env,
                  const std::string& self, const std::string& cwd);

// The variables a remote rank gets from the launcher's environment, as
// horovodrun forwards them: PATH, PYTHONPATH, LD_LIBRARY_PATH and every
// CHORUS_*, HOROVOD_*, NCCL_* one, then -x NAME[=VALUE].
std::map<std::string, std::string> forwardedEnvironment(const std::vector<std::string>& exports);

}  // namespace chorus::launcher
