// The ZeRO engine with ranks as threads: every stage's Adam step against a scalar
// reference over the rank-averaged gradients; checkpoint files; LR schedules.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/shm/shared_pool.h"
#include "harness.h"
#include "zero/engine.h"
#include "zero/shard_file.h"

namespace chorus::zero {
namespace {

const std::vector<size_t> kNumels = {37, 100, 5, 64, 1};

double gradOf(int rank, size_t param, size_t e, int step, int micro) {
  return std::sin(0.3 * rank + 0.7 * param + 0.01 * e + 1.3 * step + 0.5 * micro);
}

double initOf(size_t param, size_t e) { return std::cos(0.2 * param + 0.05 * e); }

// Plain Adam in double over the averaged, accumulated gradients.
std::vector<std::vector<double>> reference(int world, int steps, int micros, double lr,
                                           const std::vector<size_t>& numels) {
  std::vector<std::vector<double>> p, m, v;
  for (size_t i = 0; i < numels.size(); ++i) {
    p.emplace_back(numels[i]);
    for (size_t e = 0; e < numels[i]; ++e) p[i][e] = static_cast<float>(initOf(i, e));
    m.emplace_back(numels[i], 0.0);
    v.emplace_back(numels[i], 0.0);
  }
  for (int s = 0; s < steps; ++s)
    for (size_t i = 0; i < numels.size(); ++i)
      for (size_t e = 0; e < numels[i]; ++e) {
        double g = 0;
        for (int r = 0; r < world; ++r)
          for (int k = 0; k < micros; ++k) g += static_cast<float>(gradOf(r, i, e, s, k));
        g /= world;
        m[i][e] = 0.9 * m[i][e] + 0.1 * g;
        v[i][e] = 0.999 * v[i][e] + 0.001 * g * g;
        const double mh = m[i][e] / (1 - std::pow(0.9, s + 1)), vh = v[i][e] / (1 - std::pow(0.999, s + 1));
        p[i][e] -= lr * mh / (std::sqrt(vh) + 1e-8);
      }
  return p;
}

class EngineStages : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Steps every stage's engine on `numels` and checks the parameters against the reference.
constexpr int kSteps = 4, kMicros = 2;

void checkAdamSteps(int stage, int world, const std::vector<size_t>& numels, const testing::ConfigTweak& tweak) {
  const int steps = kSteps, micros = kMicros;
  const double lr = 1e-2;
  const auto expect = reference(world, steps, micros, lr, numels);
  testing::runRanksOk(world, [&](testing::RankContext& ctx) {
    EngineSpec spec;
    // (no clipping: the reference is plain Adam; DeepSpeed 0.19.8 would clip at 1.0)
    spec.config = DsConfig::parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0,
                                      "zero_optimization": {"stage": )" +
                                      std::to_string(stage) + R"(, "reduce_bucket_size": 90,
                                      "stage3_param_persistence_threshold": 6}})",
                                  world);
    spec.numels = numels;
    Engine engine(ctx.rt, spec);
    for (size_t i = 0; i < numels.size(); ++i) {
      std::vector<float> init(numels[i]);
      for (size_t e = 0; e < init.size(); ++e) init[e] = static_cast<float>(initOf(i, e)) + (ctx.rank ? 5.0f : 0.0f);
      engine.loadParam(i, init.data());  // rank 0's values win
    }
    engine.finishInit();
    GroupHyper h;
    h.lr = static_cast<float>(lr);
    for (int s = 0; s < steps; ++s) {
      for (int k = 0; k < micros; ++k) {
        for (size_t i = numels.size(); i-- > 0;) {
          std::vector<float> g(numels[i]);
          for (size_t e = 0; e < g.size(); ++e) g[e] = static_cast<float>(gradOf(ctx.rank, i, e, s, k));
          engine.gradReady(i, g.data());
        }
        engine.endBackward();
      }
      ASSERT_FALSE(engine.step({h}).skipped);
    }
    for (size_t i = 0; i < numels.size(); ++i) {
      const float* p;
      std::shared_ptr<Buffer> hold;
      if (stage == 3) {
        hold = engine.gathered(i);
        p = hold->as<float>();
      } else {
        p = static_cast<const float*>(engine.paramStorage(i));
      }
      for (size_t e = 0; e < numels[i]; ++e)
        ASSERT_NEAR(p[e], expect[i][e], 2e-5) << "stage " << stage << " rank " << ctx.rank << " param " << i;
      if (stage == 3) engine.release(i);
    }
    // Stage 3: after the releases only the persistent parameters (5 and 1 elements) stay gathered.
    if (stage == 3 && numels == kNumels) {
      EXPECT_EQ(engine.liveBytes(), 4u * world * (engine.plan().paramSlice(2) + engine.plan().paramSlice(4)));
    }
  }, tweak);
}

TEST_P(EngineStages, AdamStepsMatchTheReference) {
  const auto [stage, world] = GetParam();
  checkAdamSteps(stage, world, kNumels, nullptr);
}

// Parameters of over 1 MiB in all live in shared memory (stages 0-2): the
// allgather after each step writes every rank's slices straight into the other
// ranks' storage, with the same results.
// Only the 300007-element unit is over 1 MiB: each of its collectives maps the
// other rank's buffer, once on each of the 2 ranks. Stages 1 and 2 allgather the
// parameters once per step and reducescatter the gradients once per step (1) or
// per micro-batch (2). (Stage 0's allreduces of the units may be fused, and a
// fused allreduce takes the slots.)
TEST(EngineStagesShared, LargeParametersAndGradientsMoveStraightBetweenSharedStorage) {
  for (int stage : {1, 2}) {
    const uint64_t handed = SharedPool::instance()->peerMapsHanded();
    checkAdamSteps(stage, 2, {300007, 11, 70001}, [](Config& c) { c.cpuOperations = "shm"; });
    const int ops = kSteps + (stage == 1 ? kSteps : kSteps * kMicros);
    EXPECT_EQ(SharedPool::instance()->peerMapsHanded() - handed, 2u * ops) << "stage " << stage;
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, EngineStages,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 3)));

TEST(ShardFile, RoundTripsAndRefusesDamageByName) {
  const std::string path = "/tmp/chorus-shard-test-" + std::to_string(getpid());
  ShardFile f;
  f.meta = R"({"x": 1})";
  f.blobs["a"] = std::string(1000, 'a');
  f.blobs["b"] = "bee";
  f.write(path);
  ShardFile g = ShardFile::read(path);
  EXPECT_EQ(g.meta, f.meta);
  EXPECT_EQ(g.blobs, f.blobs);
  std::string raw = readFile(path);
  auto expectRefused = [&](const std::string& bytes, const char* word) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      ShardFile::read(path);
      FAIL() << "damaged file was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  expectRefused(raw.substr(0, raw.size() - 3), "truncated");
  std::string flipped = raw;
  flipped[40] ^= 1;
  expectRefused(flipped, "corrupted");
  ::unlink(path.c_str());
  EXPECT_THROW(ShardFile::read(path), Error);
}


// MoE: two engines of one model (the shared parameters', and the experts' whose
// reduced gradients count at gradFactor) step with one norm, the model's: SGD with
// clipping over both equals the reference over every parameter. Then the experts'
// shards load into an engine holding their parameters in another order.
TEST(EngineSharedNorm, EnginesOfOneModelClipByTheWholeNormAndShardsLoadThroughMaps) {
  const std::vector<size_t> shared = {37, 100}, experts = {5, 64};
  const double lr = 0.1, clip = 0.5, factor = 0.5;
  const int world = 2, steps = 2;
  const std::string dir = "/tmp/chorus-shared-norm-" + std::to_string(getpid());
  auto grad = [](int rank, size_t param, size_t e, int s) { return static_cast<float>(gradOf(rank, param, e, s, 0)); };
  for (int stage : {0, 1, 2}) {
    // The reference: parameter k of {shared..., experts...}; the experts' gradients times factor.
    std::vector<std::vector<double>> p;
    for (size_t k = 0; k < 4; ++k) {
      const size_t n = k < 2 ? shared[k] : experts[k - 2];
      p.emplace_back(n);
      for (size_t e = 0; e < n; ++e) p[k][e] = static_cast<float>(initOf(k, e));
    }
    for (int s = 0; s < steps; ++s) {
      std::vector<std::vector<double>> g(4);
      double sumsq = 0;
      for (size_t k = 0; k < 4; ++k) {
        for (size_t e = 0; e < p[k].size(); ++e) {
          double v = 0;
          for (int r = 0; r < world; ++r) v += grad(r, k, e, s);
          v = v / world * (k < 2 ? 1.0 : factor);
          g[k].push_back(v);
          sumsq += v * v;
        }
      }
      const double norm = std::sqrt(sumsq), coef = norm > clip ? clip / (norm + 1e-6) : 1.0;
      for (size_t k = 0; k < 4; ++k)
        for (size_t e = 0; e < p[k].size(); ++e) p[k][e] -= lr * coef * g[k][e];
    }
    testing::runRanksOk(world, [&](testing::RankContext& ctx) {
      auto make = [&](const std::vector<size_t>& numels, double gradFactor) {
        EngineSpec spec;
        spec.config = DsConfig::parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.5,
            "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 60}})", world);
        spec.numels = numels;
        spec.optimizer = OptimKind::kSgd;
        spec.gradFactor = gradFactor;
        return std::make_unique<Engine>(ctx.rt, spec);
      };
      auto a = make(shared, 1.0), b = make(experts, factor);
      for (size_t k = 0; k < 4; ++k) {
        Engine& en = k < 2 ? *a : *b;
        std::vector<float> init(k < 2 ? shared[k] : experts[k - 2]);
        for (size_t e = 0; e < init.size(); ++e) init[e] = static_cast<float>(initOf(k, e));
        en.loadParam(k % 2, init.data());
      }
      a->finishInit();
      b->finishInit();
      GroupHyper h;
      h.lr = static_cast<float>(lr);
      for (int s = 0; s < steps; ++s) {
        for (size_t k = 0; k < 4; ++k) {
          std::vector<float> g(k < 2 ? shared[k] : experts[k - 2]);
          for (size_t e = 0; e < g.size(); ++e) g[e] = grad(ctx.rank, k, e, s);
          (k < 2 ? *a : *b).gradReady(k % 2, g.data());
        }
        a->endBackward();
        b->endBackward();
        const double total = a->gradSumSquares() + b->gradSumSquares();
        const StepResult ra = a->step({h}, total), rb = b->step({h}, total);
        ASSERT_EQ(ra.gradNorm, rb.gradNorm);
      }
      for (size_t k = 0; k < 4; ++k) {
        const float* got = static_cast<const float*>((k < 2 ? *a : *b).paramStorage(k % 2));
        for (size_t e = 0; e < p[k].size(); ++e)
          ASSERT_NEAR(got[e], p[k][e], 1e-5) << "stage " << stage << " parameter " << k << " element " << e;
      }
      // The experts' shards into an engine that holds them swapped (and on another stage's layout).
      ::mkdir(dir.c_str(), 0755);
      const std::string shard = dir + "/s" + std::to_string(stage) + "_" + std::to_string(ctx.rank);
      if (b->writesShard()) b->saveShard(shard, "{}");
      ctx.rt.barrier();
      auto c = make({experts[1], experts[0]}, factor);
      std::vector<float> zeros(experts[1], 0.0f);
      c->loadParam(0, zeros.data());
      c->loadParam(1, zeros.data());
      c->finishInit();
      std::vector<std::string> paths;
      for (int r = 0; r < (stage == 0 ? 1 : world); ++r)
        paths.push_back(dir + "/s" + std::to_string(stage) + "_" + std::to_string(r));
      c->loadShards(paths, "", std::vector<std::vector<int64_t>>(paths.size(), {1, 0}));
      for (size_t k = 2; k < 4; ++k) {
        const float* got = static_cast<const float*>(c->paramStorage(k == 2 ? 1 : 0));
        for (size_t e = 0; e < p[k].size(); ++e) ASSERT_NEAR(got[e], p[k][e], 1e-5) << "loaded parameter " << k;
      }
      // A map that leaves an element of this engine without a value is refused.
      auto d = make({experts[1], experts[0]}, factor);
      d->loadParam(0, zeros.data());
      d->loadParam(1, zeros.data());
      d->finishInit();
      EXPECT_THROW(d->loadShards(paths, "", std::vector<std::vector<int64_t>>(paths.size(), {1, -1})), Error);
      ctx.rt.barrier();
    });
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::zero
