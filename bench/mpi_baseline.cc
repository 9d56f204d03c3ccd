#include "mpi_baseline.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#ifdef CHORUS_BENCH_MPI
#include <mpi.h>
#endif

namespace chorus::bench {

bool builtWithMpi() {
#ifdef CHORUS_BENCH_MPI
  return true;
#else
  return false;
#endif
}

namespace {
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

void requireMpi() {
  if (!builtWithMpi()) {
    throw InvalidArgument("--compare mpi needs chorus-bench built with Open MPI (Debian libopenmpi-dev)");
  }
}

void MpiBaseline::measure(Runtime& rt, const std::string& self, const MpiCase& c) {
  requireMpi();
  if (rt.rank() == 0) {
    const std::string json = "/tmp/chorus-bench-mpi-" + std::to_string(getpid()) + ".json";
    std::ostringstream cmd;
    // The chorus ranks wait in a barrier meanwhile, so MPI has the cores.
    // MPI's ranks get the binding chorus's have: bound to cores when chorusrun
    // bound this rank (its CPU mask is not the whole machine), else unbound.
    // mpirun starts from this rank's mask, so widen it for the child and
    // restore it after.
    cpu_set_t mine, all;
    sched_getaffinity(0, sizeof(mine), &mine);
    CPU_ZERO(&all);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < cpus && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    const bool bound = CPU_COUNT(&mine) < CPU_COUNT(&all);
    sched_setaffinity(0, sizeof(all), &all);
    cmd << "mpirun --allow-run-as-root --oversubscribe --bind-to " << (bound ? "core" : "none") << " -np "
        << rt.size() << " " << quote(self) << " --coll " << c.op << " -b " << c.bytes << " -e " << c.bytes
        << " -w " << c.warmup << " -n " << c.iters << " -d " << quote(c.dtype) << (c.rotate ? "" : " --reuse-buffers")
        << " --mpi-child " << quote(json) << " > /dev/null";
    if (!announced_) std::fprintf(stderr, "chorus-bench: measuring Open MPI: %s (and so for every size)\n", cmd.str().c_str());
    announced_ = true;
    const int rc = std::system(cmd.str().c_str());
    sched_setaffinity(0, sizeof(mine), &mine);
    if (rc != 0) std::fprintf(stderr, "chorus-bench: the MPI baseline failed (status %d); no mpi rows\n", rc);
    std::ifstream in(json);
    if (in) {
      nlohmann::json rows = nlohmann::json::parse(in);
      for (const auto& r : rows) {
        const std::string op = r["op"];
        const size_t bytes = r["bytes"];
        auto it = std::find_if(results_.begin(), results_.end(),
                               [&](const MpiResult& m) { return m.op == op && m.bytes == bytes; });
        if (it == results_.end()) it = results_.insert(results_.end(), MpiResult{op, bytes, {}});
        it->roundsUs.push_back(r["time_us"]);
      }
    }
    std::remove(json.c_str());
  }
  rt.barrier();
}

const MpiResult* MpiBaseline::find(const std::string& op, size_t bytes) const {
  for (const auto& r : results_)
    if (r.op == op && r.bytes == bytes) return &r;
  return nullptr;
}

#ifdef CHORUS_BENCH_MPI
namespace {
MPI_Datatype mpiType(const std::string& d) {
  if (d == "float32" || d == "float" || d == "fp32") return MPI_FLOAT;
  if (d == "float64" || d == "double") return MPI_DOUBLE;
  if (d == "int32") return MPI_INT32_T;
  if (d == "int64") return MPI_INT64_T;
  if (d == "int8") return MPI_INT8_T;
  if (d == "uint8") return MPI_UINT8_T;
  return MPI_DATATYPE_NULL;
}
}  // namespace

int runMpiChild(const std::vector<std::string>& ops, const std::string& dtype, size_t lo, size_t hi, double factor,
                int warmup, int iters, bool rotate, const std::string& jsonPath) {
  MPI_Init(nullptr, nullptr);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Datatype t = mpiType(dtype);
  nlohmann::json rows = nlohmann::json::array();
  if (t != MPI_DATATYPE_NULL) {
    int es;
    MPI_Type_size(t, &es);
    for (const auto& op : ops) {
      for (size_t bytes = lo; bytes <= hi;) {
        size_t elems = bytes / es;
        const bool perRank = op != "allreduce" && op != "broadcast";
        if (perRank) elems -= elems % n;
        const size_t total = elems * es;
        const int sets = bufferSets(bytes, rotate);
        std::vector<std::vector<char>> in(sets, std::vector<char>(std::max<size_t>(total, 1), 0));
        std::vector<std::vector<char>> out(sets, std::vector<char>(std::max<size_t>(total, 1), 0));
        auto once = [&](int i) {
          char* a = in[i % sets].data();
          char* b = out[i % sets].data();
          const int c = static_cast<int>(elems), per = static_cast<int>(elems / n);
          if (op == "allreduce") MPI_Allreduce(a, b, c, t, MPI_SUM, MPI_COMM_WORLD);
          if (op == "allgather") MPI_Allgather(a, per, t, b, per, t, MPI_COMM_WORLD);
          if (op == "broadcast") MPI_Bcast(b, c, t, 0, MPI_COMM_WORLD);
          if (op == "alltoall") MPI_Alltoall(a, per, t, b, per, t, MPI_COMM_WORLD);
          if (op == "reducescatter") MPI_Reduce_scatter_block(a, b, per, t, MPI_SUM, MPI_COMM_WORLD);
        };
        for (int i = 0; i < warmup; ++i) once(i);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) once(i);
        double us = (MPI_Wtime() - t0) * 1e6 / iters, worst;
        MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        rows.push_back({{"op", op}, {"bytes", total}, {"time_us", worst}});
        size_t next = static_cast<size_t>(static_cast<double>(bytes) * factor);
        bytes = next > bytes ? next : bytes + 1;
      }
    }
  }
  if (rank == 0) std::ofstream(jsonPath) << rows.dump() << "\n";
  MPI_Finalize();
  return 0;
}
#else
int runMpiChild(const std::vector<std::string>&, const std::string&, size_t, size_t, double, int, int, bool,
                const std::string&) {
  std::fprintf(stderr, "chorus-bench was built without Open MPI\n");
  return 2;
}
#endif

}  // namespace chorus::bench
