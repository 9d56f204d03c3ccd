// chorus-bench: collective bandwidth and latency in the manner of nccl-tests.
// Run as: chorusrun -np N chorus-bench [-b 8 -e 64M -f 4] [--op allreduce] [--json FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench_ops.h"
#include "memory_floor.h"
#include "mpi_baseline.h"
#include "json_file.h"
#include "parse_size.h"

using namespace chorus;
using namespace chorus::bench;

namespace {

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

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-bench: collective performance, nccl-tests style"};
  std::string minBytes = "8", maxBytes = "64M", dtypeName = "float32", opName = "sum", which = "all", jsonPath;
  double factor = 2;
  int warmup = 5, iters = 20, checkFlag = 1, repeat = 1;
  app.add_option("-b,--minbytes", minBytes, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", maxBytes, "largest size");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this each step")->check(CLI::Range(1.01, 1e9));
  app.add_option("-w,--warmup_iters", warmup, "warm-up iterations per size (sizes under 1M: up to 10x, see -n)");
  app.add_option("-n,--iters", iters,
                 "timed iterations per size; sizes under 1M run 1M/size times as many (at most 10x), so that "
                 "a small size is timed over more than a few dozen microseconds")
      ->check(CLI::PositiveNumber);
  app.add_option("-d,--datatype", dtypeName, "dtype: float32, float16, bfloat16, float64, int32, int64, int8, uint8");
  app.add_option("-o,--op", opName, "reduce op: sum, prod, max, min, avg");
  app.add_option("-c,--check", checkFlag, "check results (1) or not (0)");
  app.add_option("-r,--repeat", repeat, "rounds of the whole sweep (each peer in turn); rows show the median")
      ->check(CLI::PositiveNumber);
  app.add_option("--coll,--collective", which,
                 "allreduce, allgather, broadcast, alltoall, reducescatter or all");
  app.add_option("--json", jsonPath, "also write the rows as a JSON array to this file");
  std::string compare;
  bool reuse = false;
  app.add_option("--compare", compare, "peers measured beside chorus in the same run: tcp, mpi (comma-separated)");
  app.add_flag("--reuse-buffers", reuse, "reuse one buffer set (default: rotate fresh buffers)");
  std::string outputs = "bench";
  app.add_option("--outputs", outputs,
                 "who allocates chorus's outputs: bench (its rotating buffers) or chorus (as Horovod's API, which "
                 "returns new tensors: allgather, alltoall and reducescatter allocate them, allreduce writes into "
                 "buffers from chorus::allocateShared; broadcast is in place)")
      ->check(CLI::IsMember({"bench", "chorus"}));
  std::string inputs = "bench";
  app.add_option("--inputs", inputs,
                 "who allocates the inputs: bench (private rotating buffers) or chorus (chorus::allocateShared, as "
                 "ZeRO's gradient buckets; reducescatter then reads every local rank's input directly)")
      ->check(CLI::IsMember({"bench", "chorus"}));
  std::string mpiChild;
  app.add_option("--mpi-child", mpiChild, "(internal) measure Open MPI under mpirun and write JSON here");
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

  const bool rotate = !reuse;
  if (!mpiChild.empty()) {
    std::vector<std::string> names;
    if (which == "all") {
      names = {"allreduce", "allgather", "broadcast", "alltoall", "reducescatter"};
    } else {
      names = {which};
    }
    return runMpiChild(names, dtypeName, parseSize(minBytes), parseSize(maxBytes), factor, warmup, iters, rotate,
                       mpiChild);
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
    std::vector<std::string> peers;
    for (size_t pos = 0; !compare.empty() && pos != std::string::npos;) {
      size_t next = compare.find(',', pos);
      peers.push_back(compare.substr(pos, next == std::string::npos ? next : next - pos));
      pos = next == std::string::npos ? next : next + 1;
    }
    init();
    Runtime& rt = defaultRuntime();
    const int n = rt.size();
    const bool root = rt.rank() == 0;
    MpiBaseline mpi;
    std::vector<std::string> pathNames = {"chorus"};
    bool withMpi = false;
    for (const auto& p : peers) {
      if (p == "mpi") {
        requireMpi();  // before the chorus rounds, not after them
        withMpi = true;
      } else if (p != "tcp") {
        throw InvalidArgument("--compare: unknown peer '" + p + "' (tcp, mpi)");
      } else {
        pathNames.push_back("tcp");
      }
    }
    auto sizesOf = [&] {
      std::vector<size_t> sizes;
      for (size_t bytes = lo; bytes <= hi;) {
        sizes.push_back(bytes);
        size_t next = static_cast<size_t>(static_cast<double>(bytes) * factor);
        bytes = next > bytes ? next : bytes + 1;
      }
      return sizes;
    };
    const std::vector<size_t> sizes = sizesOf();
    struct Result {
      size_t bytes;
      int64_t count, wrong;
      std::vector<double> roundsUs;  // one mean per round
    };
    // results[path][op][size index]. One path at a time, so that an idle peer
    // runtime does not steal cycles from the one being measured.
    std::map<std::string, std::map<BenchOp, std::vector<Result>>> results;
    std::map<size_t, double> floorUs;
    std::map<size_t, double> gatherFloorUs;  // allgather's own floor (concurrentGatherMicros)
    int64_t totalWrong = 0;
    // Each size is measured on every path (and Open MPI) in turn, round after
    // round, so that a slow spell of the machine falls on all of them alike;
    // each row reports the median round.
    for (int round = 0; round < repeat; ++round) {
      for (BenchOp op : ops) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          const size_t bytes = sizes[k];
          const int sets = bufferSets(bytes, rotate);
          const int scale = static_cast<int>(std::clamp<size_t>((1u << 20) / std::max<size_t>(bytes, 1), 1, 10));
          const int warm = warmup * scale, timed = iters * scale;
          for (const auto& pathName : pathNames) {
            Runtime tcpRuntime;
            Runtime* prt = &rt;
            if (pathName == "tcp") {
              Config c;
              c.cpuOperations = "tcp";
              tcpRuntime.init(c);
              prt = &tcpRuntime;
            }
            if (pathName == "chorus") {
              // The best of every round's floor.
              auto keepBest = [&](std::map<size_t, double>& m, double us) {
                m[bytes] = m.count(bytes) ? std::min(m[bytes], us) : us;
              };
              keepBest(floorUs, concurrentMemcpyMicros(rt, bytes, 5, sets));
              if (op == BenchOp::kAllgather) keepBest(gatherFloorUs, concurrentGatherMicros(rt, bytes, 5, sets));
            }
            auto& rows = results[pathName][op];
            BenchCase bc(*prt, op, dtype, redop, bytes, sets, {outputs == "chorus", inputs == "chorus"});
            int64_t wrong = checkFlag ? sumAcrossRanks(*prt, bc.check()) : 0;
            // Chorus-allocated outputs: every buffer of the rotation is made (and
            // mapped by the peers) before the timing, as the bench's own are.
            const int warmRuns = outputs == "chorus" ? std::max(warm, sets + 1) : warm;
            for (int i = 0; i < warmRuns; ++i) bc.run(i);
            prt->barrier();
            auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < timed; ++i) bc.run(i);
            double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / timed;
            if (rows.size() <= k) rows.push_back({bc.bytes(), bc.count(), 0, {}});
            rows[k].wrong += wrong;
            rows[k].roundsUs.push_back(maxAcrossRanks(*prt, us));
            totalWrong += wrong;
            if (tcpRuntime.isInitialized()) tcpRuntime.shutdown();
          }
          if (withMpi) mpi.measure(rt, argv[0], {benchOpName(op), bytes, dtypeName, warm, timed, rotate});
        }
      }
    }
    nlohmann::json rows = nlohmann::json::array();
    for (BenchOp op : ops) {
      if (root) {
        std::printf(
            "#\n# chorus-bench %s  ranks %d  dtype %s  redop %s  warmup %d  iters %d  buffers %s  outputs %s  "
            "inputs %s  rounds %d\n#\n",
            benchOpName(op), n, dtypeName.c_str(), reduceOpName(redop), warmup, iters, rotate ? "rotating" : "reused",
            outputs.c_str(), inputs.c_str(), repeat);
        std::printf("# %12s %12s %7s %12s %9s %9s %7s %8s %8s\n", "size", "count", "path", "time", "algbw",
                    "busbw", "#wrong", "vs_mpi", "floor");
        std::printf("# %12s %12s %7s %12s %9s %9s %7s %8s %8s\n", "(B)", "(elements)", "", "(us)", "(GB/s)",
                    "(GB/s)", "", "(x)", "(frac)");
      }
      for (size_t k = 0; k < sizes.size(); ++k) {
        const MpiResult* mpiRow = mpi.find(benchOpName(op), results["chorus"][op][k].bytes);
        const double gatherFl = op == BenchOp::kAllgather ? gatherFloorUs[sizes[k]] : 0;
        // Every allgather row also carries its fraction of the allgather's own floor.
        auto withGatherFloor = [&](nlohmann::json& row, double us) {
          if (gatherFl <= 0) return;
          row["gather_floor_us"] = gatherFl;
          row["gather_floor_fraction"] = gatherFl / us;
        };
        for (const auto& pathName : pathNames) {
          const Result& r = results[pathName][op][k];
          const double us = medianOf(r.roundsUs);
          const double algbw = r.bytes / us / 1e3;  // GB/s
          const double busbw = algbw * busFactor(op, n);
          const double vsMpi = mpiRow ? mpiRow->timeUs() / us : 0;
          const double fl = floorUs[sizes[k]];
          const double floorFrac = fl > 0 ? fl / us : 0;
          if (root) {
            std::printf("  %12zu %12lld %7s %12.2f %9.3f %9.3f %7lld %8s %8s\n", r.bytes,
                        static_cast<long long>(r.count), pathName.c_str(), us, algbw, busbw,
                        static_cast<long long>(r.wrong), vsMpi ? fmt(vsMpi).c_str() : "-",
                        floorFrac ? fmt(floorFrac).c_str() : "-");
          }
          nlohmann::json row = {{"op", benchOpName(op)}, {"path", pathName}, {"bytes", r.bytes},
                                {"count", r.count}, {"dtype", dtypeName}, {"ranks", n}, {"time_us", us},
                                {"algbw_gbs", algbw}, {"busbw_gbs", busbw}, {"wrong", r.wrong},
                                {"rounds_us", r.roundsUs}, {"outputs", outputs}, {"inputs", inputs}};
          if (pathName == "chorus") {
            row["floor_fraction"] = floorFrac;
            row["floor_time_us"] = fl;
            if (vsMpi) row["ratio_vs_mpi"] = vsMpi;
          }
          withGatherFloor(row, us);
          rows.push_back(row);
        }
        if (mpiRow) {
          const double mpiUs = mpiRow->timeUs();
          const double algbw = mpiRow->bytes / mpiUs / 1e3;
          const double fl = floorUs[sizes[k]];
          const double floorFrac = fl > 0 ? fl / mpiUs : 0;
          if (root) {
            std::printf("  %12zu %12s %7s %12.2f %9.3f %9.3f %7s %8s %8s\n", mpiRow->bytes, "-", "mpi", mpiUs,
                        algbw, algbw * busFactor(op, n), "-", "1.00", floorFrac ? fmt(floorFrac).c_str() : "-");
          }
          nlohmann::json row = {{"op", benchOpName(op)}, {"path", "mpi"}, {"bytes", mpiRow->bytes},
                                {"dtype", dtypeName}, {"ranks", n}, {"time_us", mpiUs}, {"algbw_gbs", algbw},
                                {"busbw_gbs", algbw * busFactor(op, n)}, {"wrong", 0},
                                {"rounds_us", mpiRow->roundsUs}, {"floor_fraction", floorFrac}};
          withGatherFloor(row, mpiUs);
          rows.push_back(row);
        }
        if (root && gatherFl > 0) {
          const double chorusUs = medianOf(results["chorus"][op][k].roundsUs);
          std::printf("# %12zu gather floor %.2f us: chorus at %.2f of it", sizes[k], gatherFl, gatherFl / chorusUs);
          if (mpiRow) std::printf(", mpi at %.2f", gatherFl / mpiRow->timeUs());
          std::printf(" (all ranks at once stream their piece into every place of their output)\n");
        }
      }
      if (root) std::fflush(stdout);
    }
    if (root) {
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(totalWrong), totalWrong ? "FAILED" : "OK");
      if (!jsonPath.empty()) {
        writeJsonFile(jsonPath, rows);
      }
    }
    shutdown();
    return totalWrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-bench: %s\n", e.what());
    return 2;
  }
}
