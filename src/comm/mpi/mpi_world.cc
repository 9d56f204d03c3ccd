// The one place that knows whether chorus was built with MPI.
#include "comm/mpi/mpi_world.h"

#include <cstdlib>

#include "chorus/error.h"

#ifdef CHORUS_WITH_MPI
#include <mpi.h>

#include "comm/mpi/mpi_communicator.h"
#endif

namespace chorus {

bool launchedByMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

#ifdef CHORUS_WITH_MPI

bool mpiBuilt() { return true; }

namespace {

class MpiWorldImpl : public MpiWorld {
 public:
  explicit MpiWorldImpl(MPI_Comm comm) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiWorldImpl() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool threadsMultiple() const override {
    int provided = 0;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_MULTIPLE;
  }

  std::string broadcastString(const std::string& s, int root) override {
    int len = static_cast<int>(s.size());
    MPI_Bcast(&len, 1, MPI_INT, root, comm_);
    std::string out = rank_ == root ? s : std::string(static_cast<size_t>(len), '\0');
    MPI_Bcast(out.data(), len, MPI_CHAR, root, comm_);
    return out;
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    int key = -1;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == rank_) key = static_cast<int>(i);
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, key >= 0 ? 1 : MPI_UNDEFINED, key, &sub);
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<MpiWorld> openMpiWorld(int64_t commHandle, bool needThreads) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    // Finalize at exit, after chorus's communicators are gone.
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (needThreads && provided < MPI_THREAD_MULTIPLE) {
    throw InvalidArgument(
        "CHORUS_CPU_OPERATIONS=mpi runs collectives from chorus's background threads, which needs "
        "MPI_THREAD_MULTIPLE, but MPI was initialized with a lower thread level; initialize MPI with "
        "MPI_Init_thread(MPI_THREAD_MULTIPLE) (mpi4py does by default), or use CHORUS_CPU_OPERATIONS=auto");
  }
  MPI_Comm comm = commHandle < 0 ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(commHandle));
  if (comm == MPI_COMM_NULL) throw InvalidArgument("init(comm=...): the communicator is MPI_COMM_NULL");
  return std::make_unique<MpiWorldImpl>(comm);
}

#else

bool mpiBuilt() { return false; }

std::unique_ptr<MpiWorld> openMpiWorld(int64_t, bool) {
  throw InvalidArgument(
      "this chorus was built without MPI: install Open MPI (Debian libopenmpi-dev) and rebuild to run under "
      "mpirun, use MPI communicators or CHORUS_CPU_OPERATIONS=mpi; or start the job with chorusrun");
}

#endif

}  // namespace chorus
