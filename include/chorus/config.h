#pragma once
// Every setting of the runtime, with its CHORUS_* variable and HOROVOD_* alias.
// The table itself (names, defaults, meanings) lives in src/core/config.cc.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/settings.h"

namespace chorus {

class Store;
class DeviceBackend;

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct Config {
  // Identity. -1 / empty means "take it from the environment".
  int rank = -1;
  int size = -1;
  std::string hostname;  // host identity used for local/cross ranks

  // Rendezvous: either an explicit store (tests, embedding) or a TCP store address.
  std::shared_ptr<Store> store;
  std::string rendezvousAddr;
  int rendezvousPort = 0;
  std::string secret;
  // Who serves that store: "launcher" (chorusrun, another process) or "rank0" (rank 0
  // of the job serves it on rendezvousPort: jobs a cluster engine starts, Spark, Ray).
  std::string rendezvousServer = "launcher";
  // Address the TCP data transport listens on; empty: the one this host reaches
  // the rendezvous store from (loopback when the store is on this host).
  std::string bindAddress;
  std::string iface;                      // network interface (overrides bindAddress)

  // Data path between ranks: "auto" (shared memory when every rank of a set is on
  // one host, TCP otherwise), "shm", or "tcp" (Gloo; "gloo" is accepted too).
  std::string cpuOperations = "auto";
  // Where negotiation runs: "auto" (over the data path), "mpi", or "tcp"/"gloo".
  std::string controller = "auto";
  bool shmDisable = false;          // never shared memory, even within a host
  bool shmSingleCopy = true;        // ops on shared-pool buffers reach peers' buffers directly
  int64_t shmSlotBytes = 1 << 20;
  std::string shmPeerPath = "auto";  // large collectives pass data through: auto, cache, memory
  // Sets spanning hosts: -1 auto (when a host has several of the set's ranks), 0 off, 1 on.
  int hierarchicalAllreduce = -1;
  int hierarchicalAllgather = -1;
  // CUDA tensors (CHORUS_GPU_OPERATIONS): auto, nccl or host (staged).
  std::string gpuOperations = "auto";
  int64_t gpuStageChunkBytes = 4 << 20;
  // Tests: the device backend (the host stand-in); null: CUDA, opened on first use.
  std::shared_ptr<DeviceBackend> device;  // bytes per rank per round of a shared-memory collective
  std::string jobId;               // names shared-memory segments so chorusrun can clean them up

  int64_t fusionThresholdBytes = 128ll << 20;
  double cycleTimeMs = 1.0;
  // Allreduces larger than this run in chunks, with a negotiation between two, so
  // that a higher-priority op does not wait for all of one: -1 the transport's
  // size (CommTraits::preemptChunkBytes), 0 never chunked.
  int64_t preemptChunkBytes = -1;
  int cacheCapacity = 1024;
  // Autotune (Horovod's HOROVOD_AUTOTUNE*): each process set's first rank tunes the
  // fusion threshold and cycle time from its traffic's bytes per second.
  bool autotune = false;
  std::string autotuneLog;  // CSV of every sample and the chosen point ("" none)
  int autotuneWarmupSamples = 3;
  int autotuneStepsPerSample = 10;
  int autotuneMaxSamples = 20;
  double autotuneNoise = 0.8;
  double autotuneSampleSeconds = 0.2;  // and at least this long per sample
  double timeoutSeconds = 30.0;
  double startTimeoutSeconds = 30.0;
  double stallCheckSeconds = 60.0;
  bool stallCheckDisable = false;
  double stallShutdownSeconds = 0.0;  // 0: never shut down on a stall
  // Every rank of a set blocked this long on ops others never submitted: those
  // ops fail (StallError) and the set goes on; 0: never.
  double blockedFailSeconds = 60.0;
  LogLevel logLevel = LogLevel::kWarning;
  std::string timeline;             // Chrome trace written by rank 0 ("" none)
  bool timelineMarkCycles = false;  // mark every negotiation cycle in it
  int metricsPort = 0;              // > 0: Prometheus text on this port + the local rank
  std::string metricsBind;          // where it listens ("" the rank's own address)

  // MPI: -2 not requested (but detected when mpirun started the process and
  // chorusrun did not), -1 MPI_COMM_WORLD, else a Fortran communicator handle
  // (MPI_Comm_c2f; mpi4py's comm.py2f()) that chorus is restricted to.
  int64_t mpiCommHandle = -2;

  // Elastic training (chorusrun --min-np/--max-np): this worker's identity (set
  // by chorusrun); rank and size then come from the driver's rounds.
  std::string elasticWorker;
  double elasticTimeoutSeconds = 600.0;
  int64_t elasticStartRound = 0;  // joins only rounds after this one

  // Process sets given at init (static), and whether add/remove is allowed.
  std::vector<std::vector<int>> processSets;
  bool dynamicProcessSets = false;

  // Fills every field that is still unset from CHORUS_* / HOROVOD_* variables.
  static Config fromEnv();
  void applyEnv();
};

}  // namespace chorus
