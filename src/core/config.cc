#include "chorus/config.h"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include "chorus/error.h"

namespace chorus {

namespace {

double parseNumber(const char* name, const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) throw std::invalid_argument("trailing characters");
    return d;
  } catch (const std::exception&) {
    throw InvalidArgument(std::string("setting ") + name + "='" + v + "' is not a number");
  }
}

template <typename T>
void readNumber(const char* name, T* field) {
  std::string v;
  if (readSetting(name, &v) && !v.empty()) *field = static_cast<T>(parseNumber(name, v));
}

LogLevel parseLevel(const std::string& v) {
  if (v == "trace" || v == "TRACE") return LogLevel::kTrace;
  if (v == "debug" || v == "DEBUG") return LogLevel::kDebug;
  if (v == "info" || v == "INFO") return LogLevel::kInfo;
  if (v == "warning" || v == "WARNING" || v == "warn") return LogLevel::kWarning;
  if (v == "error" || v == "ERROR") return LogLevel::kError;
  if (v == "fatal" || v == "FATAL") return LogLevel::kFatal;
  throw InvalidArgument("setting CHORUS_LOG_LEVEL='" + v +
                        "' is not one of trace, debug, info, warning, error, fatal");
}

}  // namespace

void Config::applyEnv() {
  std::string v;
  if (rank < 0) readNumber("CHORUS_RANK", &rank);
  if (size < 0) readNumber("CHORUS_SIZE", &size);
  if (hostname.empty()) {
    if (readSetting("CHORUS_HOSTNAME", &v)) {
      hostname = v;
    } else {
      char buf[256] = {0};
      gethostname(buf, sizeof(buf) - 1);
      hostname = buf;
    }
  }
  if (!store) {
    if (rendezvousAddr.empty() && readSetting("CHORUS_RENDEZVOUS_ADDR", &v)) rendezvousAddr = v;
    if (rendezvousPort == 0) readNumber("CHORUS_RENDEZVOUS_PORT", &rendezvousPort);
    if (secret.empty() && readSetting("CHORUS_SECRET", &v)) secret = v;
    if (readSetting("CHORUS_RENDEZVOUS_SERVER", &v)) rendezvousServer = v;
    if (rendezvousServer != "launcher" && rendezvousServer != "rank0")
      throw InvalidArgument("CHORUS_RENDEZVOUS_SERVER='" + rendezvousServer + "' is not one of launcher, rank0");
  }
  if (readSetting("CHORUS_BIND_ADDR", &v)) bindAddress = v;
  if (readSetting("CHORUS_IFACE", &v)) iface = v;
  if (readSetting("CHORUS_CPU_OPERATIONS", &v)) cpuOperations = v;
  if (cpuOperations == "gloo") cpuOperations = "tcp";
  if (cpuOperations != "auto" && cpuOperations != "shm" && cpuOperations != "tcp" && cpuOperations != "mpi") {
    throw InvalidArgument("CHORUS_CPU_OPERATIONS='" + cpuOperations + "' is not one of auto, shm, tcp, gloo, mpi");
  }
  if (readSetting("CHORUS_CONTROLLER", &v)) controller = v;
  if (controller == "gloo") controller = "tcp";
  if (controller != "auto" && controller != "mpi" && controller != "tcp") {
    throw InvalidArgument("CHORUS_CONTROLLER='" + controller + "' is not one of auto, mpi, tcp, gloo");
  }
  if (readSetting("CHORUS_SHM_DISABLE", &v)) shmDisable = (v == "1" || v == "true");
  if (readSetting("CHORUS_SHM_SINGLE_COPY", &v)) shmSingleCopy = !(v == "0" || v == "false");
  readNumber("CHORUS_SHM_SLOT_BYTES", &shmSlotBytes);
  if (readSetting("CHORUS_SHM_PEER_PATH", &v)) shmPeerPath = v;  // checked by the backend (checkCommOptions)
  readNumber("CHORUS_HIERARCHICAL_ALLREDUCE", &hierarchicalAllreduce);
  readNumber("CHORUS_HIERARCHICAL_ALLGATHER", &hierarchicalAllgather);
  if (gpuOperations == "auto" && readSetting("CHORUS_GPU_OPERATIONS", &v)) gpuOperations = v;
  readNumber("CHORUS_GPU_STAGE_CHUNK_BYTES", &gpuStageChunkBytes);
  if (jobId.empty() && readSetting("CHORUS_JOB_ID", &v)) jobId = v;
  if (jobId.empty()) jobId = "nojob";
  readNumber("CHORUS_FUSION_THRESHOLD", &fusionThresholdBytes);
  readNumber("CHORUS_CYCLE_TIME", &cycleTimeMs);
  if (readSetting("CHORUS_PREEMPT_CHUNK_BYTES", &v) && v != "auto")
    readNumber("CHORUS_PREEMPT_CHUNK_BYTES", &preemptChunkBytes);
  readNumber("CHORUS_CACHE_CAPACITY", &cacheCapacity);
  if (readSetting("CHORUS_AUTOTUNE", &v)) autotune = (v == "1" || v == "true");
  if (autotuneLog.empty() && readSetting("CHORUS_AUTOTUNE_LOG", &v)) autotuneLog = v;
  readNumber("CHORUS_AUTOTUNE_WARMUP_SAMPLES", &autotuneWarmupSamples);
  readNumber("CHORUS_AUTOTUNE_STEPS_PER_SAMPLE", &autotuneStepsPerSample);
  readNumber("CHORUS_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", &autotuneMaxSamples);
  readNumber("CHORUS_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", &autotuneNoise);
  readNumber("CHORUS_AUTOTUNE_SAMPLE_SECONDS", &autotuneSampleSeconds);
  readNumber("CHORUS_TIMEOUT_SECONDS", &timeoutSeconds);
  readNumber("CHORUS_START_TIMEOUT", &startTimeoutSeconds);
  readNumber("CHORUS_STALL_CHECK_TIME_SECONDS", &stallCheckSeconds);
  readNumber("CHORUS_STALL_SHUTDOWN_TIME_SECONDS", &stallShutdownSeconds);
  readNumber("CHORUS_BLOCKED_FAIL_SECONDS", &blockedFailSeconds);
  if (readSetting("CHORUS_STALL_CHECK_DISABLE", &v)) stallCheckDisable = (v == "1" || v == "true");
  if (readSetting("CHORUS_DYNAMIC_PROCESS_SETS", &v)) dynamicProcessSets = (v == "1" || v == "true");
  if (readSetting("CHORUS_LOG_LEVEL", &v)) logLevel = parseLevel(v);
  if (elasticWorker.empty() && readSetting("CHORUS_ELASTIC_WORKER", &v)) elasticWorker = v;
  readNumber("CHORUS_ELASTIC_TIMEOUT", &elasticTimeoutSeconds);
  readNumber("CHORUS_ELASTIC_ROUND", &elasticStartRound);
  if (timeline.empty() && readSetting("CHORUS_TIMELINE", &v)) timeline = v;
  if (readSetting("CHORUS_TIMELINE_MARK_CYCLES", &v)) timelineMarkCycles = (v == "1" || v == "true");
  readNumber("CHORUS_METRICS_PORT", &metricsPort);
  if (metricsBind.empty() && readSetting("CHORUS_METRICS_BIND", &v)) metricsBind = v;
  if (metricsPort < 0 || metricsPort > 65535) throw InvalidArgument("CHORUS_METRICS_PORT must be in [0, 65535]");

  if (fusionThresholdBytes < 0) throw InvalidArgument("CHORUS_FUSION_THRESHOLD must be >= 0");
  if (cycleTimeMs < 0) throw InvalidArgument("CHORUS_CYCLE_TIME must be >= 0");
  if (preemptChunkBytes < -1) throw InvalidArgument("CHORUS_PREEMPT_CHUNK_BYTES must be auto or >= 0");
  if (cacheCapacity < 0) throw InvalidArgument("CHORUS_CACHE_CAPACITY must be >= 0");
  if (autotuneWarmupSamples < 0 || autotuneStepsPerSample < 1 || autotuneMaxSamples < 1 || autotuneNoise <= 0 ||
      autotuneSampleSeconds < 0) {
    throw InvalidArgument("CHORUS_AUTOTUNE_*: warm-up samples must be >= 0, steps per sample and samples >= 1, "
                          "the noise > 0, the sample seconds >= 0");
  }
  if (timeoutSeconds <= 0) throw InvalidArgument("CHORUS_TIMEOUT_SECONDS must be > 0");
  if (gpuStageChunkBytes < 4096) throw InvalidArgument("CHORUS_GPU_STAGE_CHUNK_BYTES must be at least 4096");
}

Config Config::fromEnv() {
  Config c;
  c.applyEnv();
  return c;
}

}  // namespace chorus
