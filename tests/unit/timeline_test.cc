// Horovod's timeline: rank 0 writes a Chrome trace with a NEGOTIATE_<OP> span
// (a tick per rank whose request was seen) and an <OP> span per tensor use; the
// file is on disk while the job runs and is completed when the timeline stops.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

std::string tempPath(const std::string& tag) {
  return "/tmp/chorus-timeline-" + tag + "-" + std::to_string(getpid()) + ".json";
}


nlohmann::json readTrace(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  nlohmann::json j = nlohmann::json::parse(in);  // throws (fails the test) on a malformed trace
  EXPECT_TRUE(j.is_array());
  return j;
}

// A trace still being written: an unterminated JSON array, as Chrome's format allows.
nlohmann::json readRunningTrace(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return nlohmann::json::parse(text);  // valid JSON while the job runs, and so if it is killed
}

// The events of one tensor, in file order.
std::vector<nlohmann::json> eventsOf(const nlohmann::json& trace, const std::string& name) {
  int pid = -1;
  for (const auto& e : trace)
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name" && e["args"].value("name", "") == name)
      pid = e["pid"];
  std::vector<nlohmann::json> out;
  for (const auto& e : trace)
    if (pid >= 0 && e.value("pid", -1) == pid && e.value("ph", "") != "M") out.push_back(e);
  return out;
}

// "B:NEGOTIATE_ALLREDUCE", "X:1", "E", ...; an op span's transport prefix (which
// depends on the path the op took) reads "T": "B:T_ALLREDUCE".
std::vector<std::string> phases(const std::vector<nlohmann::json>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    const std::string ph = e["ph"];
    std::string name = e.value("name", "");
    if (e.contains("args") && e["args"].contains("transport")) {
      const std::string t = e["args"]["transport"];
      EXPECT_EQ(name.rfind(t + "_", 0), 0u) << name << " does not start with its transport " << t;
      name = "T" + name.substr(t.size());
    }
    out.push_back(ph == "E" ? ph : ph + ":" + name);
  }
  return out;
}

TEST(Timeline, RankZeroRecordsNegotiationAndExecutionOfEveryTensor) {
  const std::string path = tempPath("api");
  std::remove(path.c_str());
  runRanksOk(2, [&](RankContext& c) {
    c.rt.startTimeline(path);
    HostBuffer a(DataType::kFloat32, {4});
    AllreduceOptions ao;
    ao.name = "tl.a";
    // Rank 1 comes late the first time: the negotiation must wait for its tick.
    if (c.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    c.rt.allreduce(a.tensor(), a.tensor(), ao);
    c.rt.allreduce(a.tensor(), a.tensor(), ao);  // served from the response cache
    OpOptions o;
    o.name = "tl.g";
    c.rt.allgather(a.tensor(), o);
    c.rt.barrier();
    if (c.rank == 0) {  // on disk already, within the flush period
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      const auto running = readRunningTrace(path);
      EXPECT_EQ(phases(eventsOf(running, "tl.a")).size(), 14u);
    }
    c.rt.stopTimeline();
  });
  const auto trace = readTrace(path);
  const auto a = phases(eventsOf(trace, "tl.a"));
  const std::vector<std::string> wantA = {"B:NEGOTIATE_ALLREDUCE", "X:0", "X:1", "E", "B:QUEUE", "E",
                                          "B:T_ALLREDUCE",         "E",   "B:NEGOTIATE_ALLREDUCE", "E",
                                          "B:QUEUE",               "E",   "B:T_ALLREDUCE", "E"};
  EXPECT_EQ(a, wantA);
  const auto g = phases(eventsOf(trace, "tl.g"));
  ASSERT_GE(g.size(), 4u);
  EXPECT_EQ(g.front(), "B:NEGOTIATE_ALLGATHER");
  EXPECT_EQ(g[g.size() - 2], "B:T_ALLGATHER");
  // An op span says what it carried and how.
  int spans = 0;
  for (const auto& e : eventsOf(trace, "tl.a")) {
    if (e.value("ph", "") != "B" || !e.contains("args")) continue;
    ++spans;
    EXPECT_EQ(e["args"].value("bytes", 0), 16);
    EXPECT_EQ(e["args"].value("dtype", ""), "float32");
    EXPECT_EQ(e["args"].value("process_set", -1), 0);
    const std::string transport = e["args"].value("transport", "");
    EXPECT_TRUE(transport == "SHM" || transport == "TCP" || transport == "INLINE") << transport;
    EXPECT_GE(e["args"].value("fused_tensors", 0), 1);
  }
  EXPECT_EQ(spans, 2);
  // Time runs forward within a tensor, and rank 1's tick comes after rank 0's wait.
  const auto ev = eventsOf(trace, "tl.a");
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_GE(ev[i]["ts"].get<int64_t>(), ev[i - 1]["ts"].get<int64_t>());
  EXPECT_GE(ev[2]["ts"].get<int64_t>() - ev[0]["ts"].get<int64_t>(), 10000) << "rank 1 was 30 ms late";
  std::remove(path.c_str());
}

TEST(Timeline, SettingStartsItAtInitAndShutdownCompletesIt) {
  const std::string path = tempPath("env");
  std::remove(path.c_str());
  for (bool mark : {false, true}) {
    runRanksOk(2, [&](RankContext& c) {
      HostBuffer b(DataType::kInt32, {3});
      OpOptions o;
      o.name = "tl.bcast";
      c.rt.broadcast(b.tensor(), 1, o);
    }, [&](Config& cfg) {
      cfg.timeline = path;
      cfg.timelineMarkCycles = mark;
    });
    const auto trace = readTrace(path);
    const auto b = phases(eventsOf(trace, "tl.bcast"));
    ASSERT_GE(b.size(), 3u);
    EXPECT_EQ(b.front(), "B:NEGOTIATE_BROADCAST");
    EXPECT_EQ(b[b.size() - 2], "B:T_BROADCAST");
    int cycles = 0;
    for (const auto& e : trace) cycles += e.value("name", "") == "CYCLE_START";
    if (mark) EXPECT_GT(cycles, 0);
    else EXPECT_EQ(cycles, 0);
    std::remove(path.c_str());
  }
}

TEST(Timeline, AnUnwritablePathIsAnErrorNamingIt) {
  runRanksOk(2, [&](RankContext& c) {
    const std::string bad = "/nonexistent-chorus-dir/trace.json";
    if (c.rank == 0) {
      try {
        c.rt.startTimeline(bad);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      }
    } else {
      c.rt.startTimeline(bad);  // other ranks do not write
    }
    HostBuffer a(DataType::kFloat32, {2});
    a.set(0, c.rank);
    AllreduceOptions sum;
    sum.op = ReduceOp::kSum;
    c.rt.allreduce(a.tensor(), a.tensor(), sum);  // still serving
    EXPECT_EQ(a.get(0), 1);
  });
}

}  // namespace
}  // namespace chorus::testing
