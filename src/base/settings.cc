#include "chorus/settings.h"

#include <cstdlib>

namespace chorus {

const std::vector<SettingInfo>& settingsTable() {
  static const std::vector<SettingInfo> table = {
      {"CHORUS_RANK", "HOROVOD_RANK", "(set by chorusrun)", "Global rank of this process."},
      {"CHORUS_SIZE", "HOROVOD_SIZE", "(set by chorusrun)", "Number of ranks in the job."},
      {"CHORUS_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "(set by chorusrun)",
       "Rank among the processes of this host (the runtime recomputes it from host names)."},
      {"CHORUS_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "(set by chorusrun)", "Processes on this host."},
      {"CHORUS_CROSS_RANK", "HOROVOD_CROSS_RANK", "(set by chorusrun)", "Index of this host."},
      {"CHORUS_CROSS_SIZE", "HOROVOD_CROSS_SIZE", "(set by chorusrun)", "Number of hosts."},
      {"CHORUS_HOSTNAME", "HOROVOD_HOSTNAME", "gethostname()",
       "Host identity; ranks with the same value are local to each other. Setting different "
       "values simulates several hosts on one machine."},
      {"CHORUS_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "(set by chorusrun)",
       "Address of the rendezvous store."},
      {"CHORUS_RENDEZVOUS_PORT", "HOROVOD_GLOO_RENDEZVOUS_PORT", "(set by chorusrun)",
       "Port of the rendezvous store."},
      {"CHORUS_RENDEZVOUS_SERVER", "", "launcher",
       "Who serves the rendezvous store: launcher (chorusrun, or another process) or rank0 (rank 0 serves "
       "it on CHORUS_RENDEZVOUS_PORT with CHORUS_SECRET; chorus.spark and chorus.ray start jobs so)."},
      {"CHORUS_SECRET", "HOROVOD_SECRET_KEY", "(set by chorusrun)",
       "Job secret; the store refuses requests without it."},
      {"CHORUS_ELASTIC_WORKER", "", "(set by chorusrun)",
       "Identity of an elastic worker (host:slot); its rank and size then come from the elastic driver."},
      {"CHORUS_ELASTIC_ROUND", "", "(set by chorusrun)",
       "The elastic round current when this worker was started; it joins a later one only (a worker "
       "replacing a dead one with the same identity must not take the dead one's place in its round)."},
      {"CHORUS_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT", "600",
       "Seconds an elastic worker waits to be given a place in the job before it fails."},
      {"CHORUS_BIND_ADDR", "", "(auto)",
       "Address the TCP data transport listens on; by default the address this host reaches the "
       "rendezvous store from (127.0.0.1 when the store is on this host)."},
      {"CHORUS_IFACE", "HOROVOD_GLOO_IFACE", "", "Network interface for the TCP data transport."},
      {"CHORUS_CPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS", "auto",
       "Data path: auto (shared memory within a host, TCP across hosts), shm, tcp (Gloo), or mpi "
       "(shared memory within a host, MPI across hosts; needs mpirun and MPI_THREAD_MULTIPLE)."},
      {"CHORUS_CONTROLLER", "HOROVOD_CONTROLLER", "auto",
       "Where negotiation runs: auto (over the data path), mpi (needs mpirun), or tcp/gloo."},
      {"CHORUS_SHM_DISABLE", "", "0",
       "1: no shared memory within a host (with CHORUS_CPU_OPERATIONS=mpi, MPI carries everything)."},
      {"CHORUS_SHM_SINGLE_COPY", "", "1",
       "1: within a host, collectives whose buffers all lie in chorus's shared pool (chorus-allocated "
       "outputs, `chorus::allocateShared`, ZeRO's flat storage; 1 MiB and more) read and write the other "
       "ranks' buffers directly when the system lets a process open another's memory (probed at start); "
       "0: always through the shared segment's slots."},
      {"CHORUS_SHM_SLOT_BYTES", "", "1048576",
       "Bytes each rank moves per round of a shared-memory collective."},
      {"CHORUS_SHM_PEER_PATH", "", "auto",
       "How large shared-memory collectives pass data between ranks: cache (peers read the writer's "
       "cache), memory (written with non-temporal stores, read from DRAM), or auto (measures both "
       "while running and uses the faster)."},
      {"CHORUS_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "auto",
       "1: allreduce within each host (shared memory), then across hosts (TCP); 0: flat TCP; "
       "auto: hierarchical when a host holds several ranks of the set."},
      {"CHORUS_HIERARCHICAL_ALLGATHER", "HOROVOD_HIERARCHICAL_ALLGATHER", "auto",
       "The same choice for allgather."},
      {"CHORUS_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS", "auto",
       "CUDA tensors: auto (NCCL when every rank of a set has a GPU of its own, else staged through pinned "
       "host memory), nccl, or host (staged; Horovod's MPI and GLOO read as host)."},
      {"CHORUS_GPU_STAGE_CHUNK_BYTES", "", "4194304",
       "Staged CUDA allreduce: bytes per pipelined chunk (copy down, reduce, copy up overlap)."},
      {"CHORUS_NCCL_LIBRARY", "", "(search)",
       "Path of libnccl.so.2; else torch's nvidia/nccl/lib on sys.path, else the loader's path."},
      {"CHORUS_CUDA_BACKEND", "", "(beside libchorus)", "Path of libchorus_cuda.so, chorus's CUDA backend."},
      {"CHORUS_SIMD", "", "auto",
       "Instruction set of the CPU kernels (reductions, casts, the CPU Adam): auto (the best the CPU runs), "
       "avx512, avx2 or generic; a level the CPU lacks falls back to the best below it."},
      {"CHORUS_JOB_ID", "", "(set by chorusrun)", "Job identity; names shared-memory segments."},
      {"CHORUS_PYTHON", "", "(the console script's interpreter)",
       "Interpreter chorusrun starts .py programs with when --python is not given."},
      {"CHORUS_AGENT_TIMEOUT", "", "60",
       "Seconds of silence from the launcher after which a remote host's agent takes it for lost and ends "
       "its ranks."},
      {"CHORUS_RANK_LOG_FILE", "", "(set by chorusrun)",
       "File a rank's output goes to (chorusrun --output-filename)."},
      {"CHORUS_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "134217728",
       "Bytes of the fusion buffer; 0 disables tensor fusion."},
      {"CHORUS_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "1", "Milliseconds between negotiation cycles."},
      {"CHORUS_PREEMPT_CHUNK_BYTES", "", "auto",
       "Allreduces larger than this run in chunks with a negotiation between two, so that a "
       "higher-priority op that becomes ready goes first; auto: 1 MiB over shared memory, 4 MiB "
       "otherwise; 0: ops always run whole."},
      {"CHORUS_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "1024",
       "Entries of the response cache; 0 disables it."},
      {"CHORUS_AUTOTUNE", "HOROVOD_AUTOTUNE", "0",
       "1: each process set tunes its fusion threshold, cycle time, response cache and what its "
       "transport has of shared-memory peer path and slot size and hierarchical allreduce/allgather "
       "while the job runs (Bayesian optimisation of its bytes per second), then keeps the best."},
      {"CHORUS_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", "",
       "CSV of every autotune sample and the chosen point (process set N > 0 appends .N)."},
      {"CHORUS_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3",
       "Samples at the starting settings that are not scored."},
      {"CHORUS_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10",
       "Negotiation cycles that moved data, per sample."},
      {"CHORUS_AUTOTUNE_SAMPLE_SECONDS", "", "0.2",
       "A sample also lasts at least this long, so that it spans whole training steps whatever the "
       "cycle time."},
      {"CHORUS_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20",
       "Scored samples; then the best is measured against the starting settings (3 samples each) "
       "and kept only if no slower."},
      {"CHORUS_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8",
       "Noise of the Gaussian process, on standardised scores."},
      {"CHORUS_TIMEOUT_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS", "30",
       "Longest wait for a peer inside a collective before it fails as a peer failure."},
      {"CHORUS_START_TIMEOUT", "HOROVOD_START_TIMEOUT", "30",
       "Seconds to wait for every rank at init."},
      {"CHORUS_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS", "60",
       "Warn about tensors some ranks submitted and others did not after this long."},
      {"CHORUS_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE", "0",
       "1 disables the stall inspector."},
      {"CHORUS_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0",
       "Fail stalled tensors with an error on every rank after this long; 0 never."},
      {"CHORUS_BLOCKED_FAIL_SECONDS", "", "60",
       "When every rank of a process set has waited this long on ops that other ranks never submitted (the "
       "ranks run different code paths: a rank gave up on a collective and went on), those ops fail with an "
       "error naming them on every rank, and the set stays usable; 0: never. A TensorFlow rank counts as "
       "waiting in eager ops only (a graph's executor gives no sign that it is idle): for graphs, "
       "CHORUS_STALL_SHUTDOWN_TIME_SECONDS ends such a job, as in Horovod."},
      {"CHORUS_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "warning",
       "trace, debug, info, warning, error or fatal."},
      {"CHORUS_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS", "0",
       "1 allows adding and removing process sets at run time."},
      {"CHORUS_TIMELINE", "HOROVOD_TIMELINE", "",
       "File for a Chrome trace of every tensor's negotiation and execution, written by rank 0 "
       "(written as the job runs; shutdown or stop_timeline completes it). A path with %r: every rank "
       "writes its own, %r replaced by its rank (the process sets rank 0 is not in show in their members')."},
      {"CHORUS_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", "0",
       "1 marks every negotiation cycle in the timeline."},
      {"CHORUS_METRICS_PORT", "", "0",
       "Each rank serves its statistics in Prometheus' text format over HTTP on this port plus its local "
       "rank (0: off)."},
      {"CHORUS_METRICS_BIND", "", "(the rank's address)",
       "Address the metrics port listens on (0.0.0.0 for every interface)."},
  };
  return table;
}

bool readSetting(const char* chorusName, std::string* value) {
  if (const char* v = std::getenv(chorusName)) {
    *value = v;
    return true;
  }
  for (const auto& s : settingsTable()) {
    if (std::string(s.name) == chorusName && s.horovodAlias[0] != '\0') {
      if (const char* v = std::getenv(s.horovodAlias)) {
        *value = v;
        return true;
      }
    }
  }
  return false;
}

}  // namespace chorus
