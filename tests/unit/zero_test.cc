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

TEST(DsConfig, KeysAreThePythonTablesValuesAreChecked) {
  // Which keys exist is chorus.deepspeed's table (tests/python/test_ds_config_keys.py);
  // here a key the engine does not read is left alone, and a value it reads is checked.
  auto c = parse(R"({"train_batch_size": 8, "tensorboard": {"enabled": false}, "_comment": "x"})");
  EXPECT_EQ(c.trainBatchSize, 8);
  try {
    parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": "yes"}})");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.overlap_comm"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse(R"({"train_batch_size": 8, "zero_optimization": 2})"), InvalidArgument);
  // bf16 master weights need a ZeRO stage; bf16 optimizer states need bf16 master weights (as DeepSpeed).
  const char* master = R"({"train_batch_size": 8, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true})";
  EXPECT_THROW(parse(std::string(master) + "}"), InvalidArgument);
  auto m = parse(std::string(master) + R"(, "zero_optimization": {"stage": 1}})");
  EXPECT_TRUE(m.bf16MasterWeights);
  EXPECT_FALSE(m.bf16OptimizerStates);
  EXPECT_THROW(parse(R"({"train_batch_size": 8, "bf16": {"enabled": true, "bf16_optimizer_states": true},
                        "zero_optimization": {"stage": 1}})"),
               InvalidArgument);
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
  EXPECT_EQ(parse(R"({"train_batch_size": 8})").communicationDataType, "");
  EXPECT_EQ(parse(R"({"train_batch_size": 8, "communication_data_type": "BF16"})").communicationDataType, "bf16");
  try {
    parse(R"({"train_batch_size": 8, "communication_data_type": "int8"})");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'communication_data_type' int8"), std::string::npos) << e.what();
  }
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

TEST(PartitionPlan, EveryElementOwnedOnceInEqualAlignedSlices) {
  std::mt19937 gen(3);
  for (Layout layout : {Layout::kContiguous, Layout::kPerParam}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<size_t> sizes(1 + gen() % 12);
        for (auto& s : sizes) s = gen() % 5 == 0 ? 0 : 1 + gen() % 1000;
        const size_t bucket = 1 + gen() % 3000;
        PartitionPlan plan(sizes, world, layout, bucket, 16);
        size_t part = 0;
        for (const auto& u : plan.units()) {
          ASSERT_EQ(u.slice % 16, 0u);
          ASSERT_EQ(u.partOffset, part);
          part += u.slice;
          size_t elems = 0;
          for (size_t p : u.params) elems += sizes[p];
          // A unit exceeds the bucket only when it holds a single parameter.
          if (u.params.size() > 1) {
            ASSERT_LE(elems, bucket);
          }
          ASSERT_GE(u.slice * world, elems);
        }
        ASSERT_EQ(plan.partitionElems(), part);
        std::vector<std::vector<int>> seen(sizes.size());
        for (size_t t = 0; t < sizes.size(); ++t) seen[t].assign(sizes[t], 0);
        for (int r = 0; r < world; ++r) {
          size_t last = 0;
          for (const auto& p : plan.pieces(r)) {
            ASSERT_GE(p.partOffset, last);  // partition order, no overlap
            last = p.partOffset + p.count;
            ASSERT_LE(last, plan.partitionElems());
            const Unit& u = plan.units()[plan.unitOf(p.param)];
            ASSERT_GE(p.partOffset, u.partOffset);
            ASSERT_LE(p.partOffset + p.count, u.partOffset + u.slice);
            for (size_t i = 0; i < p.count; ++i) ++seen[p.param][p.paramOffset + i];
          }
        }
        for (const auto& v : seen)
          for (int c : v) ASSERT_EQ(c, 1);
      }
    }
  }
}

TEST(PartitionPlan, UnitsRunBackToFrontAndStageThreeSplitsEachParameter) {
  PartitionPlan c({10, 20, 30}, 2, Layout::kContiguous, 50, 4);
  ASSERT_EQ(c.units().size(), 2u);
  EXPECT_EQ(c.units()[0].params, (std::vector<size_t>{2, 1}));  // gradients arrive last parameter first
  EXPECT_EQ(c.units()[1].params, (std::vector<size_t>{0}));
  EXPECT_EQ(c.units()[0].slice, 28u);  // 50 elements over 2 ranks, aligned to 4
  PartitionPlan p({10, 3}, 2, Layout::kPerParam, 1000, 4);
  EXPECT_EQ(p.paramSlice(0), 8u);
  EXPECT_EQ(p.paramSlice(1), 4u);
  auto r1 = p.pieces(1);  // parameter 1 fits in rank 0s slice; rank 1 has the tail of parameter 0
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].param, 0u);
  EXPECT_EQ(r1[0].paramOffset, 8u);
  EXPECT_EQ(r1[0].count, 2u);
}

}  // namespace
}  // namespace chorus::zero
