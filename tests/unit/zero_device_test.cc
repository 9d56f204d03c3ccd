// The ZeRO engine on a device, through the host stand-in (whose device memory
// the host cannot touch): every stage, dtype and offload choice, Adam and SGD,
// accumulation, clipping and fp16's overflow skip, against the host engine on
// the same inputs. Two ranks, so that every sum is exact and the results equal
// bit for bit. Not a GPU test: tests/gpu runs the engine on one.
#include <filesystem>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <unistd.h>

#include "device/host_stand_in.h"
#include "harness.h"
#include "reduce/half.h"
#include "zero/engine.h"
#include "zero/shard_file.h"

namespace chorus::zero {
namespace {

const std::vector<size_t> kNumels = {37, 100, 5, 64, 1, 300};
constexpr int kSteps = 4, kMicros = 2;

// Model-dtype bytes of v.
std::vector<char> encode(const std::vector<float>& v, DataType t) {
  std::vector<char> out(v.size() * dtypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DataType::kFloat32) std::memcpy(out.data() + 4 * i, &v[i], 4);
    const uint16_t h = t == DataType::kBFloat16 ? floatToBf16(v[i]) : floatToHalf(v[i]);
    if (t != DataType::kFloat32) std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

struct Choice {
  int stage;
  DataType dtype;
  bool offload;
  OptimKind optimizer;
  bool pin = true;  // offload_optimizer's pin_memory
  bool offloadParam = false;
  std::string comm;  // communication_data_type ("": the model's)
  bool nvme = false;  // offload_optimizer to disk, in tiles smaller than a run
};

std::string configOf(const Choice& c) {
  std::string j = R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.5, "zero_optimization": {"stage": )" +
                  std::to_string(c.stage) + R"(, "reduce_bucket_size": 90, "stage3_param_persistence_threshold": 6)";
  if (c.offload) j += std::string(R"(, "offload_optimizer": {"device": "cpu", "pin_memory": )") + (c.pin ? "true" : "false") + "}";
  if (c.offloadParam && !c.nvme) j += R"(, "offload_param": {"device": "cpu", "pin_memory": true})";
  if (c.offloadParam && c.nvme)
    j += R"(, "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_size": 40, "nvme_path": ")" +
         (std::filesystem::temp_directory_path() / "chorus_zero_device_nvme").string() + R"("})";
  if (c.nvme)
    j += R"(, "sub_group_size": 50, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
         (std::filesystem::temp_directory_path() / "chorus_zero_device_nvme").string() +
         R"(", "pipeline_read": true, "pipeline_write": true})";
  j += "}";
  if (c.dtype == DataType::kFloat16) j += R"(, "fp16": {"enabled": true, "initial_scale_power": 4})";
  if (c.dtype == DataType::kBFloat16) j += R"(, "bf16": {"enabled": true})";
  if (!c.comm.empty()) j += R"(, "communication_data_type": ")" + c.comm + "\"";
  return j + "}";
}

// Trains one engine; returns its parameters (model dtype bytes) and its shard file's blobs.
struct Result {
  std::vector<std::vector<char>> params;
  std::map<std::string, std::string> shard;
  std::vector<bool> skipped;
};

Result train(Runtime& rt, int rank, const Choice& c, const std::shared_ptr<DeviceBackend>& dev, const std::string& tag) {
  EngineSpec spec;
  spec.config = DsConfig::parse(configOf(c), 2);
  spec.numels = kNumels;
  spec.dtype = c.dtype;
  spec.optimizer = c.optimizer;
  if (dev) {
    spec.device = dev;
    spec.ordinal = 0;
    spec.offloadChunkElems = 37;  // (several chunks per run: the overlap of copies and steps)
  }
  Engine engine(rt, spec);
  EXPECT_EQ(engine.device(), dev ? 0 : kHostDevice);
  const size_t es = dtypeSize(c.dtype);
  for (size_t i = 0; i < kNumels.size(); ++i) {
    std::vector<float> init(kNumels[i]);
    for (size_t e = 0; e < init.size(); ++e) init[e] = std::cos(0.2f * i + 0.05f * e) + (rank ? 5.0f : 0.0f);
    engine.loadParam(i, encode(init, c.dtype).data());  // (host memory: the device engine copies it up)
  }
  engine.finishInit();
  GroupHyper h;
  h.lr = 1e-2f;
  h.momentum = 0.9f;
  h.weightDecay = 0.01f;
  Result out;
  // The device engine's gradients come from device memory, as torch's would.
  void* devGrad = dev ? dev->allocDevice(0, 300 * 4) : nullptr;
  for (int s = 0; s < kSteps; ++s) {
    for (int k = 0; k < kMicros; ++k) {
      for (size_t i = kNumels.size(); i-- > 0;) {
        std::vector<float> g(kNumels[i]);
        for (size_t e = 0; e < g.size(); ++e) g[e] = std::sin(0.3f * rank + 0.7f * i + 0.01f * e + 1.3f * s + 0.5f * k);
        // fp16: rank 1's second step overflows, and every rank skips it.
        if (c.dtype == DataType::kFloat16 && s == 1 && rank == 1 && i == 0) g[0] = INFINITY;
        const auto bytes = encode(g, c.dtype);
        if (dev) {
          dev->copy(devGrad, bytes.data(), bytes.size(), nullptr);
          engine.gradReady(i, devGrad);
          dev->synchronizeStream(nullptr);  // (the next gradient reuses devGrad)
        } else {
          engine.gradReady(i, bytes.data());
        }
      }
      engine.endBackward();
    }
    out.skipped.push_back(engine.step({h}).skipped);
  }
  if (dev) dev->freeDevice(devGrad);
  for (size_t i = 0; i < kNumels.size(); ++i) {
    std::vector<char> p(kNumels[i] * es);
    std::shared_ptr<Buffer> hold;
    const void* src = c.stage == 3 ? (hold = engine.gathered(i))->bytes() : engine.paramStorage(i);
    if (dev) {
      dev->copy(p.data(), src, p.size(), nullptr);
      dev->synchronizeStream(nullptr);
    } else {
      std::memcpy(p.data(), src, p.size());
    }
    out.params.push_back(std::move(p));
    if (c.stage == 3) engine.release(i);
  }
  const std::string path = "/tmp/chorus_zero_device_" + std::to_string(getpid()) + "_" + tag + std::to_string(rank);
  engine.saveShard(path, "{}");
  out.shard = ShardFile::read(path).blobs;
  ::unlink(path.c_str());
  return out;
}

class DeviceEngine : public ::testing::TestWithParam<Choice> {};

TEST_P(DeviceEngine, StepsAsTheHostEngineDoesBitForBit) {
  const Choice c = GetParam();
  auto dev = makeHostStandIn();
  testing::runRanksOk(2, [&](testing::RankContext& ctx) {
    const Result host = train(ctx.rt, ctx.rank, c, nullptr, "host");
    const Result onDevice = train(ctx.rt, ctx.rank, c, dev, "device");
    EXPECT_EQ(onDevice.skipped, host.skipped);
    if (c.dtype == DataType::kFloat16) {
      EXPECT_EQ(host.skipped, (std::vector<bool>{false, true, false, false}));
    }
    for (size_t i = 0; i < kNumels.size(); ++i) ASSERT_EQ(onDevice.params[i], host.params[i]) << "param " << i;
    ASSERT_EQ(onDevice.shard.size(), host.shard.size());
    for (const auto& [name, blob] : host.shard) EXPECT_EQ(onDevice.shard.at(name), blob) << name;
    // The engine trained: its parameters moved from rank 0's initial values.
    std::vector<float> init(kNumels[1]);
    for (size_t e = 0; e < init.size(); ++e) init[e] = std::cos(0.2f * 1 + 0.05f * e);
    EXPECT_NE(host.params[1], encode(init, c.dtype));
  }, [&](Config& cfg) { cfg.device = dev; });
}

std::string nameOf(const ::testing::TestParamInfo<Choice>& info) {
  const Choice& c = info.param;
  return "stage" + std::to_string(c.stage) + "_" + dtypeName(c.dtype) + (c.offload ? "_offload" : "") +
         (c.optimizer == OptimKind::kSgd ? "_sgd" : c.optimizer == OptimKind::kAdamW ? "_adamw" : "_adam") +
         (c.offload && !c.pin ? "_pageable" : "") + (c.offloadParam ? "_offload_param" : "") + (c.comm.empty() ? "" : "_comm_" + c.comm) + (c.nvme ? "_nvme" : "");
}

std::vector<Choice> choices() {
  std::vector<Choice> out;
  for (int stage : {0, 1, 2, 3})
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16})
      for (bool offload : {false, true}) out.push_back({stage, t, offload, OptimKind::kAdam});
  for (int stage : {0, 1, 2, 3}) out.push_back({stage, DataType::kBFloat16, false, OptimKind::kSgd});
  out.push_back({2, DataType::kBFloat16, true, OptimKind::kSgd});
  out.push_back({3, DataType::kFloat32, false, OptimKind::kAdamW});
  for (int stage : {1, 3}) out.push_back({stage, DataType::kBFloat16, true, OptimKind::kAdam, false});
  for (bool opt : {false, true})
    for (DataType t : {DataType::kFloat32, DataType::kFloat16})
      out.push_back({3, t, opt, OptimKind::kAdam, true, true});
  // Reduced in another dtype: converted on the device, there and back (bf16 <-> fp16 through fp32).
  for (int stage : {0, 1, 2, 3}) {
    out.push_back({stage, DataType::kFloat32, false, OptimKind::kAdam, true, false, "bf16"});
    out.push_back({stage, DataType::kBFloat16, false, OptimKind::kAdam, true, false, "fp16"});
    out.push_back({stage, DataType::kFloat16, false, OptimKind::kAdam, true, false, "fp32"});
  }
  // The optimizer's state on disk: tiles on the host, the parameters and gradients on the device.
  for (int stage : {0, 1, 2, 3}) out.push_back({stage, DataType::kBFloat16, false, OptimKind::kAdam, true, false, "", true});
  out.push_back({3, DataType::kFloat16, false, OptimKind::kAdam, true, false, "", true});
  out.push_back({1, DataType::kFloat32, false, OptimKind::kAdamW, true, false, "", true});
  // Stage 3's parameter slices on disk too: read for each gather, written from each tile's master.
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16})
    out.push_back({3, t, false, OptimKind::kAdam, true, true, "", true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Zero, DeviceEngine, ::testing::ValuesIn(choices()), nameOf);

}  // namespace
}  // namespace chorus::zero
