// Who started this process, when chorus's own variables are absent: torchrun
// and the clusters that set torch.distributed's variables, Slurm, or mpirun.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chorus {

// How many ports a derived store port stands for: rank 0 serves on the first
// of them that is free, the others try them in the same order.
constexpr int kStorePortCandidates = 8;

struct LaunchEnv {
  std::string family;  // "torch", "slurm" or "mpi" (the MPI bootstrap takes over)
  int rank = -1;
  int size = 0;
  std::string storeAddr;  // where rank 0's store is reached
  int storePort = 0;      // where rank 0 serves it: the first of storePorts that is free
  std::vector<int> storePorts;  // storePort and the candidates after it (one port when it was given)
  std::string portSource;  // how the port was chosen, for messages
  std::string secret;     // CHORUS_SECRET, else derived from the job's own variables
  bool secretGiven = false;
  std::string jobId;      // the same on every rank of the job, different between jobs
};

// Reads the environment through `get` (getenv by default). Throws InvalidArgument
// naming the variable when a family is recognised but one of its values is bad.
std::optional<LaunchEnv> detectLaunchEnv(const std::function<const char*(const char*)>& get = nullptr);

// The first host of a Slurm node list ("node[01-03,07],gpu5" -> "node01").
std::string firstSlurmHost(const std::string& nodeList);

}  // namespace chorus
