// chorus-priority-bench: how long a small high-priority allreduce takes while a
// large low-priority one is in flight, against the same small op alone.
// Every rank starts the large op, waits a delay (spread over the large op's own
// time, round by round), then submits the small one and times it from its own
// submission; a round counts only if the large op was still running when the
// small one was submitted. Run the same command with CHORUS_PREEMPT_CHUNK_BYTES=0
// beside it for ops that run whole (bench/priority.sh does both).
// Run as: chorusrun -np 2 chorus-priority-bench [--small 8K --large 64M -r 40 --json FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "chorus/chorus.h"
#include "json_file.h"
#include "parse_size.h"

using namespace chorus;
using chorus::bench::parseSize;
using Clock = std::chrono::steady_clock;

namespace {

double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

Tensor tensorOf(std::vector<float>& v) { return Tensor{v.data(), DataType::kFloat32, {static_cast<int64_t>(v.size())}}; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-priority-bench: a small high-priority allreduce with a large low-priority one in flight"};
  std::string small = "8K", large = "64M", jsonPath;
  int rounds = 40, iters = 200;
  app.add_option("--small", small, "bytes of the high-priority allreduce");
  app.add_option("--large", large, "bytes of the low-priority allreduce in flight");
  app.add_option("-r,--rounds", rounds, "large ops, each with one small op submitted during it")->check(CLI::PositiveNumber);
  app.add_option("-n,--iters", iters, "small ops timed alone")->check(CLI::PositiveNumber);
  app.add_option("--json", jsonPath, "also write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    init();
    Runtime& rt = defaultRuntime();
    std::vector<float> sIn(parseSize(small) / 4, 1.f), sOut(sIn.size());
    std::vector<float> lIn(parseSize(large) / 4, 1.f), lOut(lIn.size());
    AllreduceOptions hi, lo;
    hi.op = lo.op = ReduceOp::kSum;
    hi.priority = 100;
    hi.name = "small";  // named, as a framework's gradients are: the response cache serves them
    lo.name = "large";
    for (int i = 0; i < 20; ++i) rt.allreduce(tensorOf(sIn), tensorOf(sOut), hi);
    for (int i = 0; i < 3; ++i) rt.allreduce(tensorOf(lIn), tensorOf(lOut), lo);

    std::vector<double> alone, largeAlone, loaded, largeLoaded;
    std::vector<double> submitted, finished;  // ns since the steady clock's epoch (one host: the same clock)
    auto ns = [](Clock::time_point t) { return static_cast<double>(t.time_since_epoch().count()); };
    rt.barrier();
    for (int i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      rt.allreduce(tensorOf(sIn), tensorOf(sOut), hi);
      alone.push_back(us(t0, Clock::now()));
    }
    for (int i = 0; i < 5; ++i) {
      rt.barrier();
      const auto t0 = Clock::now();
      rt.allreduce(tensorOf(lIn), tensorOf(lOut), lo);
      largeAlone.push_back(us(t0, Clock::now()));
    }
    const double largeUs = quantile(largeAlone, 0.5);
    int skipped = 0;
    for (int k = 0; k < rounds; ++k) {
      rt.barrier();
      const auto t0 = Clock::now();
      Work big = rt.allreduceAsync(tensorOf(lIn), tensorOf(lOut), lo);
      // Delays from 10% to 70% of the large op's time.
      const auto delay = std::chrono::microseconds(static_cast<int64_t>(largeUs * (0.1 + 0.6 * k / rounds)));
      std::this_thread::sleep_until(t0 + delay);
      const bool overlapped = !big.poll();
      const auto s0 = Clock::now();
      rt.allreduce(tensorOf(sIn), tensorOf(sOut), hi);
      const auto s1 = Clock::now();
      big.wait();
      largeLoaded.push_back(us(t0, Clock::now()));
      if (overlapped) {
        loaded.push_back(us(s0, s1));
        submitted.push_back(ns(s0));
        finished.push_back(ns(s1));
      } else {
        ++skipped;
      }
    }
    // From the last rank's submission: what a runtime can act on (before it, the
    // op waits for a peer; the ranks' wake-ups differ on a busy host).
    const int64_t m = static_cast<int64_t>(submitted.size());
    std::vector<double> all(submitted.size() * rt.size());
    if (m > 0)
      rt.allgather(Tensor{submitted.data(), DataType::kFloat64, {m}}, {},
                   [&](const Shape&, DataType) -> void* { return all.data(); });
    std::vector<double> fromLast;
    for (int64_t k = 0; k < m; ++k) {
      double last = 0;
      for (int j = 0; j < rt.size(); ++j) last = std::max(last, all[static_cast<size_t>(j * m + k)]);
      fromLast.push_back((finished[static_cast<size_t>(k)] - last) / 1e3);
    }
    if (sOut[0] != static_cast<float>(rt.size()) || lOut.back() != static_cast<float>(rt.size()))
      throw Error("wrong results: " + std::to_string(sOut[0]) + ", " + std::to_string(lOut.back()));
    const char* chunkEnv = std::getenv("CHORUS_PREEMPT_CHUNK_BYTES");
    const std::string chunk = chunkEnv && *chunkEnv ? chunkEnv : "auto";
    if (rt.rank() == 0) {
      const double a = quantile(alone, 0.5), l = quantile(loaded, 0.5), f = quantile(fromLast, 0.5);
      std::printf("# chorus-priority-bench  ranks %d  small %zu B (priority 100)  large %zu B (priority 0)  "
                  "CHORUS_PREEMPT_CHUNK_BYTES=%s\n",
                  rt.size(), sIn.size() * 4, lIn.size() * 4, chunk.c_str());
      std::printf("  small alone          median %9.1f us  p90 %9.1f\n", a, quantile(alone, 0.9));
      std::printf("  small, large running median %9.1f us  p90 %9.1f  (%zu rounds overlapped, %d not)\n", l,
                  quantile(loaded, 0.9), loaded.size(), skipped);
      std::printf("  the same from the last rank's submission: median %9.1f us  p90 %9.1f\n", f,
                  quantile(fromLast, 0.9));
      std::printf("  ratio loaded/alone   %9.2fx  (from the last submission %.2fx)\n", a > 0 ? l / a : 0,
                  a > 0 ? f / a : 0);
      std::printf("  large alone          median %9.1f us;  with the small op %9.1f us\n", largeUs,
                  quantile(largeLoaded, 0.5));
      if (!jsonPath.empty()) {
        nlohmann::json j = {{"ranks", rt.size()},         {"small_bytes", sIn.size() * 4},
                            {"large_bytes", lIn.size() * 4}, {"chunk", chunk},
                            {"small_alone_us", alone},     {"small_loaded_us", loaded},
                            {"large_alone_us", largeAlone}, {"large_loaded_us", largeLoaded},
                            {"not_overlapped", skipped},   {"small_loaded_from_last_us", fromLast},
                            {"ratio_from_last_median", a > 0 ? f / a : 0},   {"ratio_median", a > 0 ? l / a : 0}};
        chorus::bench::writeJsonFile(jsonPath, j, 1);
      }
    }
    shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-priority-bench: %s\n", e.what());
    return 1;
  }
}
