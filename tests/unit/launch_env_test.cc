// How init() recognises the launchers that are not chorusrun.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "core/launch_env.h"

namespace chorus {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> getter() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(LaunchEnv, NothingSetIsNoLauncher) { EXPECT_FALSE(detectLaunchEnv(FakeEnv{}.getter()).has_value()); }

TEST(LaunchEnv, TorchrunVariables) {
  FakeEnv env{{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"},
               {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "abc"}}};
  auto e = detectLaunchEnv(env.getter());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->family, "torch");
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->size, 4);
  EXPECT_EQ(e->storeAddr, "10.1.2.3");
  EXPECT_EQ(e->storePort, 29501);  // torch.distributed keeps MASTER_PORT
  EXPECT_FALSE(e->secretGiven);
  // Every rank derives the same secret and job id; another run of the job does not.
  FakeEnv other = env;
  other.vars["RANK"] = "0";
  auto o = detectLaunchEnv(other.getter());
  EXPECT_EQ(o->secret, e->secret);
  EXPECT_EQ(o->jobId, e->jobId);
  other.vars["TORCHELASTIC_RUN_ID"] = "abd";
  o = detectLaunchEnv(other.getter());
  EXPECT_NE(o->secret, e->secret);
  EXPECT_NE(o->jobId, e->jobId);
  other.vars["CHORUS_SECRET"] = "s3cret";
  other.vars["CHORUS_RENDEZVOUS_PORT"] = "4000";
  o = detectLaunchEnv(other.getter());
  EXPECT_EQ(o->secret, "s3cret");
  EXPECT_TRUE(o->secretGiven);
  EXPECT_EQ(o->storePort, 4000);
}

TEST(LaunchEnv, TorchWinsOverSlurmAndMpi) {
  FakeEnv env{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"},
               {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n1"},
               {"OMPI_COMM_WORLD_SIZE", "2"}}};
  EXPECT_EQ(detectLaunchEnv(env.getter())->family, "torch");
  env.vars.erase("MASTER_ADDR");  // an incomplete torch environment is not one
  EXPECT_EQ(detectLaunchEnv(env.getter())->family, "slurm");
  env.vars.erase("SLURM_PROCID");
  EXPECT_EQ(detectLaunchEnv(env.getter())->family, "mpi");
}

TEST(LaunchEnv, SlurmVariables) {
  FakeEnv env{{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
               {"SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}}};
  auto e = detectLaunchEnv(env.getter());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->family, "slurm");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->size, 8);
  EXPECT_EQ(e->storeAddr, "gpu07");
  EXPECT_GE(e->storePort, 20000);
  EXPECT_LT(e->storePort, 40000);
  env.vars["SLURM_STEP_ID"] = "1";  // the next step of the job meets on its own port
  EXPECT_NE(detectLaunchEnv(env.getter())->storePort, e->storePort);
  env.vars.erase("SLURM_STEP_NODELIST");
  EXPECT_THROW(detectLaunchEnv(env.getter()), InvalidArgument);
}

// A derived port may be taken: rank 0 serves on the first free of a fixed
// list that every rank computes alike; a port the user gave is that port alone.
TEST(LaunchEnv, DerivedStorePortsComeWithTheirCandidates) {
  FakeEnv torch{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}}};
  auto e = detectLaunchEnv(torch.getter());
  EXPECT_EQ(e->storePorts, (std::vector<int>{29501, 29502, 29503, 29504, 29505, 29506, 29507, 29508}));
  torch.vars["MASTER_PORT"] = "65533";  // at the top: the ports below MASTER_PORT, which is never one
  e = detectLaunchEnv(torch.getter());
  EXPECT_EQ(e->storePorts, (std::vector<int>{65534, 65535, 65532, 65531, 65530, 65529, 65528, 65527}));
  EXPECT_EQ(e->storePort, 65534);
  torch.vars["CHORUS_RENDEZVOUS_PORT"] = "4000";
  EXPECT_EQ(detectLaunchEnv(torch.getter())->storePorts, (std::vector<int>{4000}));

  FakeEnv slurm{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n1"},
                 {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}}};
  e = detectLaunchEnv(slurm.getter());
  ASSERT_EQ(e->storePorts.size(), static_cast<size_t>(kStorePortCandidates));
  EXPECT_EQ(e->storePorts[0], e->storePort);
  for (size_t i = 1; i < e->storePorts.size(); ++i) {  // the next ones, round within [20000, 40000)
    EXPECT_EQ(e->storePorts[i], e->storePorts[i - 1] == 39999 ? 20000 : e->storePorts[i - 1] + 1);
  }
  slurm.vars["SLURM_PROCID"] = "1";
  EXPECT_EQ(detectLaunchEnv(slurm.getter())->storePorts, e->storePorts);
}

TEST(LaunchEnv, SlurmNodeLists) {
  EXPECT_EQ(firstSlurmHost("node1"), "node1");
  EXPECT_EQ(firstSlurmHost("node1,node2"), "node1");
  EXPECT_EQ(firstSlurmHost("node[01-03,07],gpu5"), "node01");
  EXPECT_EQ(firstSlurmHost("rack[3,5]-ib"), "rack3-ib");
  EXPECT_EQ(firstSlurmHost("a[002-004]"), "a002");
  EXPECT_THROW(firstSlurmHost("broken[]"), InvalidArgument);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  FakeEnv env{{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}};
  try {
    detectLaunchEnv(env.getter());
    FAIL() << "rank 2 of 2 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='2'"), std::string::npos) << e.what();
  }
  env.vars["RANK"] = "0";
  env.vars["MASTER_PORT"] = "http";
  EXPECT_THROW(detectLaunchEnv(env.getter()), InvalidArgument);
}

}  // namespace
}  // namespace chorus
