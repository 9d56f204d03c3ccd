// A rank program for the process-level tests; run under chorusrun. Each scenario
// prints lines the tests look for and exits 0 when the rank behaved as expected.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "reduce/cast.h"

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

// elements: 4M (16 MiB of float32) lands the kill inside a large allreduce; a
// few hundred, among small ones. shared: the buffer comes from allocateShared, so
// that the allreduces and reducescatters in between take the direct paths
// (ranks reading and writing each other's buffers).
int killed(int64_t n, bool shared = false) {
  init();
  Runtime& rt = defaultRuntime();
  std::vector<float> own(shared ? 0 : n, 1.0f);
  std::shared_ptr<void> pooled = shared ? allocateShared(n * sizeof(float)) : nullptr;
  float* buf = shared ? static_cast<float*>(pooled.get()) : own.data();
  std::fill(buf, buf + n, 1.0f);
  if (rank() == 1) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      kill(getpid(), SIGKILL);
    }).detach();
  }
  auto start = Clock::now();
  try {
    for (int i = 0;; ++i) {
      const Tensor t{buf, DataType::kFloat32, {n}};
      rt.allreduce(t, t, sum("big"));
      if (shared) {
        ReducescatterOptions o;
        o.name = "big.rs";
        rt.reducescatter(t, o).wait();
      }
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
  try {  // the store refuses the handshake: the connection itself fails
    auto store = connectTcpStore(addr, std::atoi(port), "not-the-secret", std::chrono::seconds(5));
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

// The collective matrix as one program, for runs under chorusrun and mpirun alike.
int matrix() {
  Config cfg;
  cfg.dynamicProcessSets = true;
  init(cfg);
  Runtime& rt = defaultRuntime();
  const int r = rt.rank(), n = rt.size();
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "rank %d: %s\n", r, what.c_str());
    return 1;
  };
  const DataType dts[] = {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kUInt16, DataType::kInt32, DataType::kInt64, DataType::kFloat16,
                          DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
  for (DataType dt : dts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      // 20011: 20-160 KiB, one shared-memory round; 300001: over 1 MiB for 4-
      // and 8-byte types (sliced hierarchical allreduce).
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1031}, int64_t{20011}, int64_t{300001}}) {
        // value(rank, i) in a small range every dtype holds exactly
        auto value = [&](int rk, int64_t i) -> double {
          return op == ReduceOp::kProduct ? 1 + (i + rk) % 2 : (i * 3 + rk * 5) % 7;
        };
        std::vector<double> in(count), expect(count);
        std::vector<char> buf(std::max<int64_t>(count, 1) * dtypeSize(dt));
        Tensor t{buf.data(), dt, {count}};
        for (int64_t i = 0; i < count; ++i) {
          double acc = value(0, i);
          for (int k = 1; k < n; ++k) {
            double v = value(k, i);
            acc = op == ReduceOp::kSum ? acc + v : op == ReduceOp::kMin ? std::min(acc, v)
                : op == ReduceOp::kMax ? std::max(acc, v) : acc * v;
          }
          expect[i] = acc;
          elementFromDouble(buf.data(), dt, i, value(r, i));
        }
        AllreduceOptions o;
        o.op = op;
        o.name = std::string("m.") + dtypeName(dt) + reduceOpName(op) + std::to_string(count);
        rt.allreduce(t, t, o);
        for (int64_t i = 0; i < count; ++i) {
          const double got = elementToDouble(buf.data(), dt, i);  // small integers: exact in every dtype
          if (got != expect[i]) return fail(std::string("allreduce ") + o.name + " element " + std::to_string(i));
        }
      }
    }
  }
  // allgather with uneven rows, broadcast, alltoall, reducescatter on float64
  std::vector<double> mine(r + 1, r);
  Work g = rt.allgather(Tensor{mine.data(), DataType::kFloat64, {r + 1}});
  const double* gd = static_cast<const double*>(g.output().data);
  for (int k = 0, pos = 0; k < n; ++k)
    for (int j = 0; j <= k; ++j, ++pos)
      if (gd[pos] != k) return fail("allgather");
  // Over 1 MiB in all, uneven (the sliced hierarchical allgather).
  const int64_t big = 70000;
  std::vector<double> many(big + r);
  for (int64_t i = 0; i < big + r; ++i) many[i] = r * 1e6 + i;
  Work gb = rt.allgather(Tensor{many.data(), DataType::kFloat64, {big + r}});
  const double* gbd = static_cast<const double*>(gb.output().data);
  for (int k = 0, pos = 0; k < n; ++k)
    for (int64_t i = 0; i < big + k; ++i, ++pos)
      if (gbd[pos] != k * 1e6 + i) return fail("large allgather from rank " + std::to_string(k));
  double b = r * 10.0;
  rt.broadcast(Tensor{&b, DataType::kFloat64, {1}}, n - 1);
  if (b != (n - 1) * 10.0) return fail("broadcast");
  std::vector<double> send(n);
  for (int k = 0; k < n; ++k) send[k] = 100 * r + k;
  Work a = rt.alltoall(Tensor{send.data(), DataType::kFloat64, {n}}, {});
  for (int k = 0; k < n; ++k)
    if (static_cast<const double*>(a.output().data)[k] != 100 * k + r) return fail("alltoall");
  std::vector<double> rs(2 * n + 1, 1.0);
  ReducescatterOptions ro;
  ro.op = ReduceOp::kSum;
  Work w = rt.reducescatter(Tensor{rs.data(), DataType::kFloat64, {2 * n + 1}}, ro);
  if (w.output().shape[0] != 2 + (r < 1 ? 1 : 0) || static_cast<const double*>(w.output().data)[0] != n)
    return fail("reducescatter");
  // a dynamic process set of the even ranks
  std::vector<int> evens;
  for (int k = 0; k < n; k += 2) evens.push_back(k);
  ProcessSet ps = rt.addProcessSet(evens);
  if (ps.included()) {
    double v = 1;
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    o.processSet = ps.id();
    rt.allreduce(Tensor{&v, DataType::kFloat64, {1}}, Tensor{&v, DataType::kFloat64, {1}}, o);
    if (v != static_cast<double>(evens.size())) return fail("process set allreduce");
  }
  rt.removeProcessSet(ps.id());
  rt.barrier();
  say("rank " + std::to_string(r) + " of " + std::to_string(n) + ": matrix ok");
  shutdown();
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
    if (s == "kill") return killed(int64_t{4} << 20);
    if (s == "kill_small") return killed(300);
    if (s == "kill_direct") return killed(int64_t{4} << 20, true);
    if (s == "stall") return stall();
    if (s == "two_sets") return twoSets();
    if (s == "bad_secret") return badSecret();
    if (s == "leak_before_attach") return leakBeforeAttach();
    if (s == "matrix") return matrix();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "unknown scenario %s\n", s.c_str());
  return 2;
}
