// A rank program for the process-level tests; run under chorusrun. Each scenario
// prints lines the tests look for and exits 0 when the rank behaved as expected.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"

using namespace chorus;
using Clock = std::chrono::steady_clock;

namespace {

AllreduceOptions sum(const std::string& name, int32_t set = 0) {
  AllreduceOptions o;
  o.op = ReduceOp::kSum;
  o.name = name;
  o.processSet = set;
  return o;
}

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

int mismatch() {
  init();
  Runtime& rt = defaultRuntime();
  DataType dt = rank() == 1 ? DataType::kFloat64 : DataType::kFloat32;
  std::vector<double> buf(4, 1.0);
  try {
    rt.allreduce(Tensor{buf.data(), dt, {4}}, Tensor{buf.data(), dt, {4}}, sum("weights"));
    say("no error");
    return 1;
  } catch (const Mismatch& e) {
    say("mismatch on rank " + std::to_string(rank()) + ": " + e.what());
  }
  float v = 1.0f;
  rt.allreduce(Tensor{&v, DataType::kFloat32, {1}}, Tensor{&v, DataType::kFloat32, {1}}, sum("next"));
  say("next collective on rank " + std::to_string(rank()) + " gave " + std::to_string(static_cast<int>(v)));
  shutdown();
  return 0;
}

int killed() {
  init();
  Runtime& rt = defaultRuntime();
  const int64_t n = 4 << 20;  // 16 MiB of float32: the kill lands inside a large allreduce
  std::vector<float> buf(n, 1.0f);
  if (rank() == 1) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      kill(getpid(), SIGKILL);
    }).detach();
  }
  auto start = Clock::now();
  try {
    for (int i = 0;; ++i) {
      rt.allreduce(Tensor{buf.data(), DataType::kFloat32, {n}}, Tensor{buf.data(), DataType::kFloat32, {n}},
                   sum("big"));
    }
  } catch (const PeerFailure& e) {
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    say("peer failure on rank " + std::to_string(rank()) + " after " + std::to_string(secs) + " s: " + e.what());
  }
  // Later collectives fail at once, and shutdown does not hang.
  try {
    float v = 1;
    rt.allreduce(Tensor{&v, DataType::kFloat32, {1}}, Tensor{&v, DataType::kFloat32, {1}}, sum("after"));
    say("later collective succeeded");
    return 1;
  } catch (const PeerFailure&) {
    say("later collective failed too on rank " + std::to_string(rank()));
  }
  const int me = rank();
  shutdown();
  say("shutdown done on rank " + std::to_string(me));
  return 0;
}

int stall() {
  init();
  Runtime& rt = defaultRuntime();
  if (rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  float v = 1;
  rt.allreduce(Tensor{&v, DataType::kFloat32, {1}}, Tensor{&v, DataType::kFloat32, {1}}, sum("stalled.tensor"));
  say("stalled tensor done on rank " + std::to_string(rank()) + " = " + std::to_string(static_cast<int>(v)));
  shutdown();
  return 0;
}

int twoSets() {
  Config cfg;
  cfg.processSets = {{0, 1}, {1, 2}};
  init(cfg);
  Runtime& rt = defaultRuntime();
  float x = 1;
  Tensor tx{&x, DataType::kFloat32, {1}};
  if (rank() == 0) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // the slow rank of set 1
    rt.allreduce(tx, tx, sum("a", 1));
  } else if (rank() == 1) {
    Work wa = rt.allreduceAsync(tx, tx, sum("a", 1));
    auto start = Clock::now();
    for (int s = 0; s < 50; ++s) {
      float y = 1;
      rt.allreduce(Tensor{&y, DataType::kFloat32, {1}}, Tensor{&y, DataType::kFloat32, {1}},
                   sum("b" + std::to_string(s), 2));
    }
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    say("set 2 finished 50 allreduces in " + std::to_string(secs) + " s; set 1 op pending: " +
        (wa.poll() ? "no" : "yes"));
    wa.wait();
  } else {
    for (int s = 0; s < 50; ++s) {
      float y = 1;
      rt.allreduce(Tensor{&y, DataType::kFloat32, {1}}, Tensor{&y, DataType::kFloat32, {1}},
                   sum("b" + std::to_string(s), 2));
    }
  }
  say("set 1 result on rank " + std::to_string(rank()) + " = " + std::to_string(static_cast<int>(x)));
  shutdown();
  return 0;
}

int badSecret() {
  const char* addr = std::getenv("CHORUS_RENDEZVOUS_ADDR");
  const char* port = std::getenv("CHORUS_RENDEZVOUS_PORT");
  auto store = connectTcpStore(addr, std::atoi(port), "not-the-secret", std::chrono::seconds(5));
  try {
    store->get("chorus/generation/0", std::chrono::seconds(1));
    say("request without the secret was served");
    return 1;
  } catch (const InvalidArgument& e) {
    say(std::string("refused as expected: ") + e.what());
  }
  init();  // the real secret still works
  defaultRuntime().barrier();
  shutdown();
  return 0;
}

// Rank 1 dies before attaching to the shared-memory segment rank 0 created.
int leakBeforeAttach() {
  if (std::atoi(std::getenv("CHORUS_RANK")) == 1) {
    // Play the first steps of init by hand (generation, host name), so that rank 0
    // goes on to create the segment, then die before attaching.
    auto store = connectTcpStore(std::getenv("CHORUS_RENDEZVOUS_ADDR"), std::atoi(std::getenv("CHORUS_RENDEZVOUS_PORT")),
                                 std::getenv("CHORUS_SECRET"), std::chrono::seconds(5));
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const int64_t gen = store->add("chorus/generation/1", 1);
    store->set("chorus/g" + std::to_string(gen) + "/host/1", std::vector<char>(host, host + std::strlen(host)));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return 1;
  }
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    std::string prefix = std::string("chorus-") + std::getenv("CHORUS_JOB_ID") + "-";
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind(prefix, 0) == 0;
    say("segments while waiting: " + std::to_string(n));
  }).detach();
  init();  // blocks until rank 1 attaches, which it never does
  return 0;
}

}  // namespace


int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: chorus_test_worker mismatch|kill|stall|two_sets|bad_secret\n");
    return 2;
  }
  std::string s = argv[1];
  try {
    if (s == "mismatch") return mismatch();
    if (s == "kill") return killed();
    if (s == "stall") return stall();
    if (s == "two_sets") return twoSets();
    if (s == "bad_secret") return badSecret();
    if (s == "leak_before_attach") return leakBeforeAttach();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "unknown scenario %s\n", s.c_str());
  return 2;
}
