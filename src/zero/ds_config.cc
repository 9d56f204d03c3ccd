#include "zero/ds_config.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "chorus/error.h"

namespace chorus::zero {

namespace {

using nlohmann::json;

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

void requireObject(const json& obj, const std::string& path) {
  if (!obj.is_object()) throw InvalidArgument("DeepSpeed config: '" + path + "' must be an object");
}

template <typename T>
T get(const json& obj, const std::string& key, const std::string& path, T fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::invalid_argument("not a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw std::invalid_argument("not an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw std::invalid_argument("not a number");
    } else {
      if (!it->is_string()) throw std::invalid_argument("not a string");
    }
    return it->get<T>();
  } catch (const std::exception&) {
    throw InvalidArgument("DeepSpeed config: '" + join(path, key) + "' has the wrong type (" + it->dump() + ")");
  }
}

int64_t positive(const json& obj, const std::string& key, const std::string& path) {
  int64_t v = get<int64_t>(obj, key, path, 0);
  if (obj.contains(key) && v <= 0) throw InvalidArgument("DeepSpeed config: '" + join(path, key) + "' must be > 0");
  return v;
}

void resolveBatch(DsConfig& c, int world) {
  const int64_t tb = c.trainBatchSize, mb = c.microBatch, ga = c.gradAccum;
  const std::string w = std::to_string(world);
  if (tb && mb && ga) {
    if (tb != mb * ga * world) {
      throw InvalidArgument("DeepSpeed config: train_batch_size must equal train_micro_batch_size_per_gpu * "
                            "gradient_accumulation_steps * world size, but " + std::to_string(tb) + " != " +
                            std::to_string(mb) + " * " + std::to_string(ga) + " * " + w);
    }
  } else if (tb && mb) {
    if (tb % (mb * world)) {
      throw InvalidArgument("DeepSpeed config: train_batch_size " + std::to_string(tb) + " is not divisible by " +
                            "train_micro_batch_size_per_gpu * world size = " + std::to_string(mb * world));
    }
    c.gradAccum = tb / (mb * world);
  } else if (tb && ga) {
    if (tb % (ga * world)) {
      throw InvalidArgument("DeepSpeed config: train_batch_size " + std::to_string(tb) + " is not divisible by " +
                            "gradient_accumulation_steps * world size = " + std::to_string(ga * world));
    }
    c.microBatch = tb / (ga * world);
  } else if (tb) {
    if (tb % world) {
      throw InvalidArgument("DeepSpeed config: train_batch_size " + std::to_string(tb) + " is not divisible by " +
                            w + " (the world size)");
    }
    c.gradAccum = 1;
    c.microBatch = tb / world;
  } else if (mb) {
    c.gradAccum = ga ? ga : 1;
    c.trainBatchSize = mb * c.gradAccum * world;
  } else {
    throw InvalidArgument("DeepSpeed config: train_batch_size or train_micro_batch_size_per_gpu is required");
  }
}

}  // namespace

DsConfig DsConfig::parse(const std::string& text, int world) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(std::string("DeepSpeed config is not valid JSON: ") + e.what());
  }
  requireObject(j, "the config");
  for (const char* key : {"sequence_parallel_size", "data_parallel_size"})
    if (j.contains(key) && !(j[key].is_number_integer() && j[key].get<int64_t>() > 0))
      throw InvalidArgument(std::string("DeepSpeed config: '") + key + "' must be a positive integer, got " +
                            j[key].dump());
  DsConfig c;
  c.trainBatchSize = positive(j, "train_batch_size", "");
  c.microBatch = positive(j, "train_micro_batch_size_per_gpu", "");
  c.gradAccum = positive(j, "gradient_accumulation_steps", "");
  resolveBatch(c, world);
  c.gradientClipping = get<double>(j, "gradient_clipping", "", 1.0);  // DeepSpeed 0.19.8's default
  c.forceDsCpuOptimizer = get<bool>(j, "zero_force_ds_cpu_optimizer", "", true);

  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    requireObject(o, "optimizer");
    if (!o.contains("type")) throw InvalidArgument("DeepSpeed config: 'optimizer.type' is required");
    c.optimizer.present = true;
    // Which types run, and with which params, is the Python layer's (chorus.deepspeed's optimizer table).
    std::string t = get<std::string>(o, "type", "optimizer", "");
    std::transform(t.begin(), t.end(), t.begin(), ::tolower);
    c.optimizer.type = t;
    if (o.contains("params")) {
      const json& p = o["params"];
      requireObject(p, "optimizer.params");
      c.optimizer.lr = get<double>(p, "lr", "optimizer.params", c.optimizer.lr);
      c.optimizer.eps = get<double>(p, "eps", "optimizer.params", c.optimizer.eps);
      c.optimizer.weightDecay = get<double>(p, "weight_decay", "optimizer.params", 0.0);
      c.optimizer.momentum = get<double>(p, "momentum", "optimizer.params", 0.0);
      c.optimizer.adamWMode = get<bool>(p, "adam_w_mode", "optimizer.params", true);
      if (p.contains("betas")) {
        const json& b = p["betas"];
        if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
          throw InvalidArgument("DeepSpeed config: 'optimizer.params.betas' must be two numbers");
        c.optimizer.beta1 = b[0].get<double>();
        c.optimizer.beta2 = b[1].get<double>();
      }
    }
  }

  if (j.contains("scheduler")) {
    const json& s = j["scheduler"];
    requireObject(s, "scheduler");
    if (!s.contains("type")) throw InvalidArgument("DeepSpeed config: 'scheduler.type' is required");
    c.scheduler.present = true;
    c.scheduler.type = get<std::string>(s, "type", "scheduler", "");
    static const std::set<std::string> kTypes = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                 "LRRangeTest"};
    if (!kTypes.count(c.scheduler.type))
      throw InvalidArgument("DeepSpeed config: 'scheduler.type' " + c.scheduler.type +
                            " is not one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest");
    if (s.contains("params") && !s["params"].is_object())
      throw InvalidArgument("DeepSpeed config: 'scheduler.params' must be an object");
  }

  if (j.contains("fp16")) {
    const json& f = j["fp16"];
    requireObject(f, "fp16");
    c.fp16.enabled = get<bool>(f, "enabled", "fp16", false);
    const double ls = get<double>(f, "loss_scale", "fp16", 0.0);
    c.fp16.scaler.dynamic = ls == 0.0;
    c.fp16.scaler.staticScale = ls == 0.0 ? 1.0 : ls;
    c.fp16.scaler.initialScalePower = get<int>(f, "initial_scale_power", "fp16", 16);
    c.fp16.scaler.window = get<int64_t>(f, "loss_scale_window", "fp16", 1000);
    c.fp16.scaler.hysteresis = get<int>(f, "hysteresis", "fp16", 2);
    c.fp16.scaler.minScale = get<double>(f, "min_loss_scale", "fp16", 1.0);
    c.fp16.scaler.consecutiveHysteresis = get<bool>(f, "consecutive_hysteresis", "fp16", false);
  }
  if (j.contains("bf16")) {
    requireObject(j["bf16"], "bf16");
    c.bf16 = get<bool>(j["bf16"], "enabled", "bf16", false);
    c.bf16CheckOverflow = get<bool>(j["bf16"], "check_grad_overflow", "bf16", true);
    c.bf16MasterWeights = get<bool>(j["bf16"], "bf16_master_weights_and_grads", "bf16", false);
    c.bf16OptimizerStates = get<bool>(j["bf16"], "bf16_optimizer_states", "bf16", false);
    if (c.bf16OptimizerStates && !c.bf16MasterWeights)
      throw InvalidArgument("DeepSpeed config: 'bf16.bf16_optimizer_states' needs bf16.bf16_master_weights_and_grads");
  }
  if (j.contains("communication_data_type") && !j["communication_data_type"].is_null()) {
    std::string v = get<std::string>(j, "communication_data_type", "", "");
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (v != "fp32" && v != "fp16" && v != "bf16")
      throw InvalidArgument("DeepSpeed config: 'communication_data_type' " + v +
                            " is not one of fp16, bf16, fp32 (as DeepSpeed's)");
    c.communicationDataType = v;
  }
  if (c.fp16.enabled && c.bf16) throw InvalidArgument("DeepSpeed config: fp16 and bf16 cannot both be enabled");

  if (c.bf16MasterWeights) {
    const json* z = j.contains("zero_optimization") ? &j["zero_optimization"] : nullptr;
    if (!z || !z->is_object() || get<int>(*z, "stage", "zero_optimization", 0) == 0)
      throw InvalidArgument("DeepSpeed config: 'bf16.bf16_master_weights_and_grads' needs a ZeRO stage (1, 2 or 3)");
  }
  if (j.contains("zero_optimization")) {
    const json& z = j["zero_optimization"];
    const std::string zp = "zero_optimization";
    requireObject(z, zp);
    c.zero.stage = get<int>(z, "stage", zp, 0);
    if (c.zero.stage < 0 || c.zero.stage > 3) throw InvalidArgument("DeepSpeed config: 'zero_optimization.stage' must be 0-3");
    auto bytes = [&](const char* key, int64_t fallback) {
      auto it = z.find(key);
      if (it == z.end()) return fallback;
      if (!it->is_number()) throw InvalidArgument("DeepSpeed config: '" + join(zp, key) + "' must be a number");
      return static_cast<int64_t>(it->get<double>());
    };
    c.zero.reduceBucketSize = bytes("reduce_bucket_size", c.zero.reduceBucketSize);
    c.zero.allgatherBucketSize = bytes("allgather_bucket_size", c.zero.allgatherBucketSize);
    c.zero.paramPersistenceThreshold = bytes("stage3_param_persistence_threshold", c.zero.paramPersistenceThreshold);
    c.zero.prefetchBucketSize = bytes("stage3_prefetch_bucket_size", c.zero.prefetchBucketSize);
    c.zero.maxLiveParameters = bytes("stage3_max_live_parameters", c.zero.maxLiveParameters);
    c.zero.overlapComm = get<bool>(z, "overlap_comm", zp, false);
    c.zero.contiguousGradients = get<bool>(z, "contiguous_gradients", zp, true);
    auto device = [&](const char* section, std::string* out, bool* pin) {
      if (!z.contains(section)) return;
      const json& o = z[section];
      const std::string path = join(zp, section);
      requireObject(o, path);
      *out = get<std::string>(o, "device", path, "none");
      if (*out != "none" && *out != "cpu" && *out != "nvme")
        throw InvalidArgument("DeepSpeed config: '" + path + ".device' " + *out + " is not none, cpu or nvme");
      if (pin) *pin = get<bool>(o, "pin_memory", path, false);
    };
    device("offload_optimizer", &c.zero.offloadOptimizer, &c.zero.pinMemory);
    device("offload_param", &c.zero.offloadParam, nullptr);
    // device nvme: the section's folder, which must be given.
    auto nvmePath = [&](const char* section, const char* what) {
      const std::string path = join(zp, section);
      std::string folder = get<std::string>(z[section], "nvme_path", path, "");
      if (folder.empty())
        throw InvalidArgument("DeepSpeed config: '" + path + ".nvme_path' is needed with device nvme: a folder on "
                              "the disk " + what + " go to");
      return folder;
    };
    if (c.zero.offloadOptimizer == "nvme") {
      const json& o = z["offload_optimizer"];
      c.zero.optimizerNvmePath = nvmePath("offload_optimizer", "the optimizer's state and master weights");
      c.zero.pipelineRead = get<bool>(o, "pipeline_read", join(zp, "offload_optimizer"), false);
      c.zero.pipelineWrite = get<bool>(o, "pipeline_write", join(zp, "offload_optimizer"), false);
    }
    if (c.zero.offloadParam == "nvme" && c.zero.stage == 3) {  // (ignored below stage 3, as "cpu" is)
      const json& o = z["offload_param"];
      const std::string path = join(zp, "offload_param");
      c.zero.paramNvmePath = nvmePath("offload_param", "the 16-bit parameters");
      c.zero.paramBufferSize = get<int64_t>(o, "buffer_size", path, c.zero.paramBufferSize);
      c.zero.paramMaxInCpu = get<int64_t>(o, "max_in_cpu", path, c.zero.paramMaxInCpu);
      if (c.zero.paramBufferSize <= 0 || c.zero.paramMaxInCpu < 0)
        throw InvalidArgument("DeepSpeed config: '" + path + ".buffer_size' must be > 0 and 'max_in_cpu' >= 0");
      if (c.zero.stage == 3 && c.zero.offloadOptimizer != "nvme")
        throw InvalidArgument("DeepSpeed config: '" + path + ".device' nvme goes with 'zero_optimization."
                              "offload_optimizer.device' nvme in chorus (the step writes the parameters from the "
                              "master weights' tiles on disk); set both to nvme, or offload_param to cpu");
    }
    c.zero.subGroupSize = bytes("sub_group_size", c.zero.subGroupSize);
    if (c.zero.subGroupSize <= 0) throw InvalidArgument("DeepSpeed config: 'zero_optimization.sub_group_size' must be > 0");
  }
  if (j.contains("aio")) {
    const json& a = j["aio"];
    requireObject(a, "aio");
    c.aioBlockSize = get<int64_t>(a, "block_size", "aio", c.aioBlockSize);
    c.aioQueueDepth = get<int64_t>(a, "queue_depth", "aio", c.aioQueueDepth);
    if (c.aioBlockSize <= 0 || c.aioQueueDepth <= 0 || c.aioQueueDepth > 4096)
      throw InvalidArgument("DeepSpeed config: 'aio.block_size' must be > 0 and 'aio.queue_depth' 1-4096");
  }
  return c;
}

}  // namespace chorus::zero
