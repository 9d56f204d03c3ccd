#pragma once
// DeepSpeed's JSON configuration, the values the engine reads: inconsistent
// batch sizes get their numbers, missing required values and wrong types are
// named. Which keys exist (DeepSpeed 0.19.8's whole table, aliases, refusals)
// is checked before, by chorus.deepspeed.runtime.config_keys.
#include <cstdint>
#include <string>

#include "zero/loss_scaler.h"

namespace chorus::zero {

struct DsConfig {
  int64_t trainBatchSize = 0;
  int64_t microBatch = 0;
  int64_t gradAccum = 0;

  struct Optimizer {
    bool present = false;
    std::string type;  // lower case, as given (the Python layer checks it)
    // As the JSON gives them (DeepSpeed's get_lr() reports 0.1, not 0.1f); the kernels take floats.
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
    double momentum = 0.0;
    bool adamWMode = true;  // DeepSpeed's type Adam decouples weight decay unless adam_w_mode is false
  } optimizer;

  // The schedule itself is Python's (deepspeed.runtime.lr_schedules, DeepSpeed's very
  // numbers), which also checks its params; here only the type is checked.
  struct Scheduler {
    bool present = false;
    std::string type;
  } scheduler;

  double gradientClipping = 1.0;  // DeepSpeed 0.19.8 clips at 1.0 unless told otherwise

  struct Fp16 {
    bool enabled = false;
    LossScalerConfig scaler;
  } fp16;
  bool bf16 = false;
  bool bf16CheckOverflow = true;  // bf16.check_grad_overflow: skip a step whose gradients are not finite
  // bf16.bf16_master_weights_and_grads / bf16_optimizer_states (ZeRO stages): the master
  // weights (and the optimizer's states) keep bf16's precision between steps.
  bool bf16MasterWeights = false, bf16OptimizerStates = false;

  struct Zero {
    int stage = 0;
    int64_t reduceBucketSize = 500'000'000;
    int64_t allgatherBucketSize = 500'000'000;
    bool overlapComm = false;
    bool contiguousGradients = true;
    std::string offloadOptimizer = "none";  // none | cpu | nvme
    bool pinMemory = false;
    std::string offloadParam = "none";
    // offload_optimizer.device nvme: the folder, and whether the step overlaps the
    // next tile's read and the last tile's write with its work (DeepSpeed's names).
    std::string optimizerNvmePath;
    bool pipelineRead = false, pipelineWrite = false;
    // The tile the optimizer steps at a time under nvme offload (DeepSpeed's sub-group).
    int64_t subGroupSize = 1'000'000'000;
    // offload_param.device nvme (stage 3): the folder, the tile of 16-bit elements moved
    // at a time (buffer_size), and the partition size kept in host memory (max_in_cpu).
    std::string paramNvmePath;
    int64_t paramBufferSize = 100'000'000;
    int64_t paramMaxInCpu = 1'000'000'000;
    int64_t paramPersistenceThreshold = 100'000;
    int64_t prefetchBucketSize = 50'000'000;
    int64_t maxLiveParameters = 1'000'000'000;
  } zero;

  bool forceDsCpuOptimizer = true;

  // The aio section: bytes per request and requests in flight of the nvme offload.
  int64_t aioBlockSize = 1 << 20;
  int64_t aioQueueDepth = 8;

  // communication_data_type: the dtype gradients are reduced in ("" = the model's).
  // fp32, fp16 or bf16; the Python layer substitutes seq_parallel_communication_data_type
  // under sequence parallelism, as DeepSpeed's engine does.
  std::string communicationDataType;

  // json: the text of a config (a file's contents or a dict dumped by Python).
  // worldSize: the data-parallel size that the batch sizes divide among.
  static DsConfig parse(const std::string& json, int worldSize);
};

}  // namespace chorus::zero
