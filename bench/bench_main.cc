// chorus-bench: collective bandwidth and latency in the manner of nccl-tests.
// Run as: chorusrun -np N chorus-bench [-b 8 -e 64M -f 4] [--op allreduce] [--json FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_ops.h"

using namespace chorus;
using namespace chorus::bench;

namespace {

size_t parseSize(const std::string& s) {
  if (s.empty()) throw InvalidArgument("empty size");
  size_t used = 0;
  double v = std::stod(s, &used);
  std::string unit = s.substr(used);
  double mult = 1;
  if (unit == "K" || unit == "k") mult = 1024;
  else if (unit == "M" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw InvalidArgument("size '" + s + "': unknown unit '" + unit + "' (use K, M or G)");
  return static_cast<size_t>(v * mult);
}

double maxAcrossRanks(Runtime& rt, double v) {
  AllreduceOptions o;
  o.op = ReduceOp::kMax;
  o.name = "bench.max";
  rt.allreduce(Tensor{&v, DataType::kFloat64, {1}}, Tensor{&v, DataType::kFloat64, {1}}, o);
  return v;
}

int64_t sumAcrossRanks(Runtime& rt, int64_t v) {
  AllreduceOptions o;
  o.op = ReduceOp::kSum;
  o.name = "bench.sum";
  rt.allreduce(Tensor{&v, DataType::kInt64, {1}}, Tensor{&v, DataType::kInt64, {1}}, o);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-bench: collective performance, nccl-tests style"};
  std::string minBytes = "8", maxBytes = "64M", dtypeName = "float32", opName = "sum", which = "all", jsonPath;
  double factor = 2;
  int warmup = 5, iters = 20, checkFlag = 1;
  app.add_option("-b,--minbytes", minBytes, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", maxBytes, "largest size");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this each step")->check(CLI::Range(1.01, 1e9));
  app.add_option("-w,--warmup_iters", warmup, "warm-up iterations per size");
  app.add_option("-n,--iters", iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("-d,--datatype", dtypeName, "dtype: float32, float16, bfloat16, float64, int32, int64, int8, uint8");
  app.add_option("-o,--op", opName, "reduce op: sum, prod, max, min, avg");
  app.add_option("-c,--check", checkFlag, "check results (1) or not (0)");
  app.add_option("--coll,--collective", which,
                 "allreduce, allgather, broadcast, alltoall, reducescatter or all");
  app.add_option("--json", jsonPath, "also write the rows as a JSON array to this file");
  try {
    // nccl-tests uses -o for the reduce op; --op selects the collective here too
    // when given a collective's name.
    std::vector<std::string> args(argv + 1, argv + argc);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--op") {
        try {
          parseBenchOp(args[i + 1]);
          args[i] = "--coll";
        } catch (const InvalidArgument&) {
          args[i] = "-o";
        }
      }
    }
    std::reverse(args.begin(), args.end());
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    const DataType dtype = parseDataType(dtypeName);
    const ReduceOp redop = parseReduceOp(opName);
    const size_t lo = parseSize(minBytes), hi = parseSize(maxBytes);
    if (lo > hi) throw InvalidArgument("-b " + minBytes + " is larger than -e " + maxBytes);
    std::vector<BenchOp> ops;
    if (which == "all") {
      ops = {BenchOp::kAllreduce, BenchOp::kAllgather, BenchOp::kBroadcast, BenchOp::kAlltoall,
             BenchOp::kReducescatter};
    } else {
      ops = {parseBenchOp(which)};
    }
    init();
    Runtime& rt = defaultRuntime();
    const int n = rt.size();
    const bool root = rt.rank() == 0;
    nlohmann::json rows = nlohmann::json::array();
    int64_t totalWrong = 0;
    for (BenchOp op : ops) {
      if (root) {
        std::printf("#\n# chorus-bench %s  ranks %d  dtype %s  redop %s  warmup %d  iters %d\n#\n",
                    benchOpName(op), n, dtypeName.c_str(), reduceOpName(redop), warmup, iters);
        std::printf("# %12s %12s %9s %7s %12s %9s %9s %7s\n", "size", "count", "type", "redop", "time",
                    "algbw", "busbw", "#wrong");
        std::printf("# %12s %12s %9s %7s %12s %9s %9s %7s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
                    "(GB/s)", "");
      }
      for (size_t bytes = lo; bytes <= hi;) {
        BenchCase bc(rt, op, dtype, redop, bytes);
        int64_t wrong = checkFlag ? sumAcrossRanks(rt, bc.check()) : 0;
        for (int i = 0; i < warmup; ++i) bc.run();
        rt.barrier();
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) bc.run();
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters;
        us = maxAcrossRanks(rt, us);
        const double algbw = bc.bytes() / us / 1e3;  // GB/s
        const double busbw = algbw * busFactor(op, n);
        totalWrong += wrong;
        if (root) {
          std::printf("  %12zu %12lld %9s %7s %12.2f %9.3f %9.3f %7lld\n", bc.bytes(),
                      static_cast<long long>(bc.count()), dtypeName.c_str(), reduceOpName(redop), us, algbw, busbw,
                      static_cast<long long>(wrong));
          std::fflush(stdout);
        }
        rows.push_back({{"op", benchOpName(op)}, {"path", "chorus"}, {"bytes", bc.bytes()},
                        {"count", bc.count()}, {"dtype", dtypeName}, {"ranks", n}, {"time_us", us},
                        {"algbw_gbs", algbw}, {"busbw_gbs", busbw}, {"wrong", wrong}});
        size_t next = static_cast<size_t>(static_cast<double>(bytes) * factor);
        bytes = next > bytes ? next : bytes + 1;
      }
    }
    if (root) {
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(totalWrong), totalWrong ? "FAILED" : "OK");
      if (!jsonPath.empty()) {
        const std::string tmp = jsonPath + ".tmp";
        std::ofstream(tmp) << rows.dump(2) << "\n";
        std::rename(tmp.c_str(), jsonPath.c_str());
      }
    }
    shutdown();
    return totalWrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-bench: %s\n", e.what());
    return 2;
  }
}
