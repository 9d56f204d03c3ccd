// chorus-p2p-bench: point-to-point between ranks 0 and 1, ping-pong as
// osu_latency does: the time per message is half a round trip. Beside it,
// Open MPI's MPI_Send/MPI_Recv on the same sizes (whole sweeps alternated
// round by round), the memory floor (one memcpy of the message by one core:
// a transfer between two processes moves at least that), and what the kernel's
// cross-memory copy reaches of that floor alone.
// Run as: chorusrun -np 2 chorus-p2p-bench [-b 8 -e 64M -f 4 -r 3] [--compare mpi] [--json FILE]
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/chorus.h"
#include "json_file.h"
#include "parse_size.h"

#ifdef CHORUS_BENCH_MPI
#include <mpi.h>
#endif

using namespace chorus;
using chorus::bench::parseSize;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<size_t> sweep(size_t lo, size_t hi, double factor) {
  std::vector<size_t> sizes;
  for (size_t b = lo; b <= hi;) {
    sizes.push_back(b);
    const size_t next = static_cast<size_t>(static_cast<double>(b) * factor);
    b = next > b ? next : b + 1;
  }
  return sizes;
}

// Enough round trips that a small message is timed over milliseconds.
int itersFor(size_t bytes, int base) {
  return static_cast<int>(std::clamp<size_t>((size_t{1} << 24) / std::max<size_t>(bytes, 1), base, 20000));
}

// The best of 7 copies of bytes: by memcpy, or (cma) by the kernel's
// cross-memory attach from this process's own memory, which is how both chorus
// and Open MPI move a large message between two processes of a host.
double copyFloorUs(size_t bytes, bool cma) {
  if (bytes == 0) return 0;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double best = 1e300;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = Clock::now();
    if (cma) {
      iovec local{b.data(), bytes}, remote{a.data(), bytes};
      if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) return 0;
    } else {
      std::memcpy(b.data(), a.data(), bytes);
    }
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return best;
}

// Half a round trip, in microseconds, on ranks 0 and 1.
double chorusHalfRtt(Runtime& rt, size_t bytes, int warmup, int iters) {
  const size_t n = std::max<size_t>(bytes, 1);
  std::vector<char> outV(n, 2), inV(n, 0);
  char* out = outV.data();
  char* in = inV.data();
  const int me = rt.rank(), peer = 1 - me;
  const Tensor tout{out, DataType::kUInt8, {static_cast<int64_t>(bytes)}};
  const Tensor tin{in, DataType::kUInt8, {static_cast<int64_t>(bytes)}};
  auto round = [&] {
    if (me == 0) {
      rt.send(tout, peer);
      rt.recv(tin, peer);
    } else {
      rt.recv(tin, peer);
      rt.send(tout, peer);
    }
  };
  for (int i = 0; i < warmup; ++i) round();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) round();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters / 2;
  if (bytes && in[bytes - 1] != 2) throw Error("chorus-p2p-bench: the message arrived wrong");
  return us;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

#ifdef CHORUS_BENCH_MPI
int mpiChild(const std::vector<size_t>& sizes, int warmup, int base, const std::string& json) {
  MPI_Init(nullptr, nullptr);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t bytes : sizes) {
    std::vector<char> out(std::max<size_t>(bytes, 1), 2), in(std::max<size_t>(bytes, 1), 0);
    const int count = static_cast<int>(bytes), peer = 1 - rank, iters = itersFor(bytes, base);
    auto round = [&] {
      if (rank == 0) {
        MPI_Send(out.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(in.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(in.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(out.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
      }
    };
    for (int i = 0; i < warmup; ++i) round();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) round();
    const double us = (MPI_Wtime() - t0) * 1e6 / iters / 2;
    rows.push_back({{"bytes", bytes}, {"time_us", us}});
  }
  if (rank == 0) std::ofstream(json) << rows.dump() << "\n";
  MPI_Finalize();
  return 0;
}
#endif

// Rank 0 runs Open MPI's sweep (2 ranks, bound as this rank is) while the chorus ranks wait.
std::map<size_t, double> mpiSweep(Runtime& rt, const std::string& self, const std::string& args) {
  std::map<size_t, double> out;
  if (rt.rank() == 0) {
    const std::string json = "/tmp/chorus-p2p-bench-mpi-" + std::to_string(getpid()) + ".json";
    cpu_set_t mine, all;
    sched_getaffinity(0, sizeof(mine), &mine);
    CPU_ZERO(&all);
    for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    const bool bound = CPU_COUNT(&mine) < CPU_COUNT(&all);
    sched_setaffinity(0, sizeof(all), &all);
    const std::string cmd = "mpirun --allow-run-as-root --oversubscribe --bind-to " + std::string(bound ? "core" : "none") +
                            " -np 2 " + quote(self) + " " + args + " --mpi-child " + quote(json) + " > /dev/null";
    const int rc = std::system(cmd.c_str());
    sched_setaffinity(0, sizeof(mine), &mine);
    if (rc != 0) std::fprintf(stderr, "chorus-p2p-bench: the MPI sweep failed (status %d): %s\n", rc, cmd.c_str());
    std::ifstream in(json);
    if (in)
      for (const auto& r : nlohmann::json::parse(in)) out[r["bytes"].get<size_t>()] = r["time_us"].get<double>();
    std::remove(json.c_str());
  }
  rt.barrier();
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-p2p-bench: point-to-point latency and bandwidth (ping-pong between ranks 0 and 1)"};
  std::string lo = "8", hi = "64M", jsonPath, compare, mpiChildJson;
  double factor = 4;
  int warmup = 5, base = 20, rounds = 3;
  app.add_option("-b,--minbytes", lo, "smallest message (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", hi, "largest message");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this each step")->check(CLI::Range(1.01, 1e9));
  app.add_option("-w,--warmup_iters", warmup, "warm-up round trips per size");
  app.add_option("-n,--iters", base, "round trips per size at least (small sizes run up to 20000)")
      ->check(CLI::PositiveNumber);
  app.add_option("-r,--repeat", rounds, "rounds of the whole sweep (chorus and MPI alternated); rows show the median")
      ->check(CLI::PositiveNumber);
  app.add_option("--compare", compare, "mpi: Open MPI's MPI_Send/MPI_Recv beside chorus");
  app.add_option("--json", jsonPath, "also write the rows as a JSON array to this file");
  app.add_option("--mpi-child", mpiChildJson, "(internal) the MPI sweep under mpirun, written here");
  CLI11_PARSE(app, argc, argv);
  const std::vector<size_t> sizes = sweep(parseSize(lo), parseSize(hi), factor);
  if (!mpiChildJson.empty()) {
#ifdef CHORUS_BENCH_MPI
    return mpiChild(sizes, warmup, base, mpiChildJson);
#else
    std::fprintf(stderr, "chorus-p2p-bench was built without Open MPI\n");
    return 2;
#endif
  }
  try {
    if (!compare.empty() && compare != "mpi") throw InvalidArgument("--compare: only mpi is known");
#ifndef CHORUS_BENCH_MPI
    if (!compare.empty()) throw InvalidArgument("--compare mpi needs chorus-p2p-bench built with Open MPI");
#endif
    init();
    Runtime& rt = defaultRuntime();
    if (rt.size() < 2) throw InvalidArgument("chorus-p2p-bench needs 2 ranks (chorusrun -np 2)");
    const bool active = rt.rank() < 2;
    std::vector<std::string> paths = {"chorus"};
    std::map<std::string, std::map<size_t, std::vector<double>>> us;  // by path ("mpi" too), size
    std::map<size_t, double> floorUs, cmaUs;
    std::ostringstream args;
    args << "-b " << lo << " -e " << hi << " -f " << factor << " -w " << warmup << " -n " << base;
    for (int round = 0; round < rounds; ++round) {
      for (size_t bytes : sizes) {
        for (const auto& path : paths) {
          rt.barrier();
          us[path][bytes].push_back(active ? chorusHalfRtt(rt, bytes, warmup, itersFor(bytes, base)) : 0);
        }
        rt.barrier();
        if (rt.rank() == 0) {
          const double f = copyFloorUs(bytes, false), c = copyFloorUs(bytes, true);
          floorUs[bytes] = floorUs.count(bytes) ? std::min(floorUs[bytes], f) : f;
          cmaUs[bytes] = cmaUs.count(bytes) ? std::min(cmaUs[bytes], c) : c;
        }
      }
      if (compare == "mpi")
        for (const auto& [bytes, t] : mpiSweep(rt, argv[0], args.str())) us["mpi"][bytes].push_back(t);
    }
    if (rt.rank() == 0) {
      if (compare == "mpi") paths.push_back("mpi");
      std::printf("#\n# chorus-p2p-bench  ping-pong between ranks 0 and 1  rounds %d  (time: half a round trip; "
                  "floor: one memcpy of the message by one core, as a fraction of the time)\n#\n# %12s", rounds, "size (B)");
      for (const auto& path : paths) std::printf(" %10s %9s %6s", (path + " us").c_str(), "GB/s", "floor");
      std::printf("%s  %9s\n", compare == "mpi" ? "  chorus vs mpi (x)" : "", "cma floor");
      nlohmann::json rows = nlohmann::json::array();
      for (size_t bytes : sizes) {
        const double fl = floorUs[bytes];
        std::printf("  %12zu", bytes);
        double best = 0;
        for (const auto& path : paths) {
          const double t = median(us[path][bytes]);
          const double gbs = t > 0 ? bytes / t / 1e3 : 0;
          std::printf(" %10.2f %9.3f %6.2f", t, gbs, fl > 0 && t > 0 ? fl / t : 0);
          nlohmann::json row = {{"path", path}, {"bytes", bytes}, {"time_us", t}, {"gbs", gbs}, {"floor_us", fl},
                                {"cma_floor_us", cmaUs[bytes]}, {"rounds_us", us[path][bytes]}};
          if (fl > 0 && t > 0) row["floor_fraction"] = fl / t;
          rows.push_back(row);
          if (path != "mpi" && t > 0) best = best > 0 ? std::min(best, t) : t;
        }
        if (compare == "mpi") std::printf("  %17.2f", best > 0 ? median(us["mpi"][bytes]) / best : 0);
        // The kernel's cross-memory copy alone, as a fraction of the memcpy floor: the bound for large messages.
        std::printf("  %9.2f\n", cmaUs[bytes] > 0 ? fl / cmaUs[bytes] : 0);
      }
      if (!jsonPath.empty()) {
        chorus::bench::writeJsonFile(jsonPath, rows);
      }
    }
    shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-p2p-bench: %s\n", e.what());
    return 2;
  }
}
