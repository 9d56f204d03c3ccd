// ZeRO engine pieces: the loss scaler's schedule (hand-derived from DeepSpeed's
// documented rules) and the DeepSpeed config parser.
#include <gtest/gtest.h>

#include "chorus/error.h"
#include "zero/ds_config.h"
#include "zero/loss_scaler.h"

namespace chorus::zero {
namespace {

TEST(LossScaler, GrowsAfterWindowAbsorbsHysteresisThenShrinks) {
  LossScalerConfig c;
  c.initialScalePower = 4;  // 16
  c.window = 4;
  c.hysteresis = 2;
  LossScaler s(c);
  // Four clean steps: the fourth completes a window.
  for (double want : {16.0, 16.0, 16.0, 32.0}) {
    EXPECT_FALSE(s.update(false));
    EXPECT_EQ(s.scale(), want);
  }
  EXPECT_TRUE(s.update(true));  // first overflow: absorbed by hysteresis
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_TRUE(s.update(true));  // second: the scale halves
  EXPECT_EQ(s.scale(), 16.0);
  for (double want : {16.0, 16.0, 16.0, 32.0}) {  // window counts from the last overflow
    s.update(false);
    EXPECT_EQ(s.scale(), want);
  }
  EXPECT_TRUE(s.update(true));  // hysteresis was refilled at the growth
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScaler, OverflowAtTheMinimumIsAnError) {
  LossScalerConfig c;
  c.initialScalePower = 1;  // 2
  c.hysteresis = 1;
  c.minScale = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), Error);
}

TEST(LossScaler, StateRoundTrips) {
  LossScalerConfig c;
  c.window = 3;
  LossScaler a(c), b(c);
  for (bool o : {false, true, false, true, true, false}) a.update(o);
  b.deserialize(a.serialize());
  for (bool o : {false, false, false, true}) {
    a.update(o);
    b.update(o);
    EXPECT_EQ(a.scale(), b.scale());
  }
  EXPECT_THROW(b.deserialize("garbage"), InvalidArgument);
}

DsConfig parse(const std::string& json, int world = 2) { return DsConfig::parse(json, world); }

TEST(DsConfig, BatchSizesDetermineEachOther) {
  auto c = parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4);
  EXPECT_EQ(c.microBatch, 4);
  c = parse(R"({"train_micro_batch_size_per_gpu": 8})", 2);
  EXPECT_EQ(c.trainBatchSize, 16);
  EXPECT_EQ(c.gradAccum, 1);
  c = parse(R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3})", 2);
  EXPECT_EQ(c.trainBatchSize, 48);
}

TEST(DsConfig, InconsistentBatchesNameTheNumbers) {
  try {
    parse(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 2);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("30 != 4 * 2 * 2"), std::string::npos) << e.what();
  }
  try {
    parse(R"({"train_batch_size": 30})", 4);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("30 is not divisible by 4"), std::string::npos) << e.what();
  }
}

TEST(DsConfig, UnknownKeysSuggestTheNearest) {
  try {
    parse(R"({"train_batch_sise": 8})");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'train_batch_size'"), std::string::npos) << e.what();
  }
  try {
    parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_com": true}})");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.overlap_com"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'overlap_comm'"), std::string::npos) << e.what();
  }
}

TEST(DsConfig, PrecisionAndRequiredValues) {
  EXPECT_THROW(parse(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
               InvalidArgument);
  try {
    parse(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.1}}})");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse(R"({})"), InvalidArgument);  // no batch size at all
  auto c = parse(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                     "hysteresis": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.8, 0.99],
                     "weight_decay": 0.1}}, "zero_optimization": {"stage": 3,
                     "offload_optimizer": {"device": "cpu", "pin_memory": true}}, "gradient_clipping": 1.0})");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_TRUE(c.fp16.scaler.dynamic);
  EXPECT_EQ(c.fp16.scaler.initialScalePower, 12);
  EXPECT_EQ(c.fp16.scaler.hysteresis, 3);
  EXPECT_EQ(c.optimizer.type, "adamw");
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offloadOptimizer, "cpu");
  EXPECT_TRUE(c.zero.pinMemory);
  EXPECT_DOUBLE_EQ(c.gradientClipping, 1.0);
  EXPECT_THROW(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})"), InvalidArgument);
  EXPECT_THROW(parse(R"({"train_batch_size": "eight"})"), InvalidArgument);
}

}  // namespace
}  // namespace chorus::zero

#include <random>

#include "zero/partition.h"

namespace chorus::zero {
namespace {

TEST(PartitionPlan, EveryElementOwnedOnceInEqualAlignedPartitions) {
  std::mt19937 gen(3);
  for (int world : {1, 2, 3, 4, 7}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<size_t> sizes(1 + gen() % 12);
      for (auto& s : sizes) s = gen() % 5 == 0 ? 0 : 1 + gen() % 1000;
      PartitionPlan plan(sizes, world, 16);
      ASSERT_EQ(plan.partitionElems() % 16, 0u);
      ASSERT_GE(plan.totalElems(), plan.realElems());
      ASSERT_LT(plan.totalElems() - plan.realElems(), static_cast<size_t>(16 * world + world));
      std::vector<std::vector<int>> seen(sizes.size());
      for (size_t t = 0; t < sizes.size(); ++t) seen[t].assign(sizes[t], 0);
      for (int r = 0; r < world; ++r) {
        for (const auto& s : plan.segmentsOf(r)) {
          ASSERT_EQ(plan.ownerOf(s.flatOffset), r);
          ASSERT_EQ(plan.ownerOf(s.flatOffset + s.count - 1), r);
          ASSERT_EQ(s.flatOffset, plan.flatOffset(s.tensor) + s.tensorOffset);
          for (size_t i = 0; i < s.count; ++i) ++seen[s.tensor][s.tensorOffset + i];
        }
      }
      for (const auto& v : seen)
        for (int c : v) ASSERT_EQ(c, 1);
    }
  }
}

}  // namespace
}  // namespace chorus::zero
