// The one place that knows whether chorus was built with MPI.
#include "comm/mpi/mpi_world.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

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

// Messages over INT_MAX bytes go as several, in order (MPI keeps their order).
constexpr size_t kPiece = size_t{1} << 30;

class MpiBulk : public P2pBulk {
 public:
  explicit MpiBulk(MPI_Comm world) {
    MPI_Comm_dup(world, &comm_);
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
    tagLimit_ = found && ub ? *ub : 32767;
  }
  ~MpiBulk() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  uint64_t startSend(const void* data, size_t bytes, int peer, uint64_t key) override {
    return start(const_cast<void*>(data), bytes, peer, key, true);
  }
  uint64_t startRecv(void* data, size_t bytes, int peer, uint64_t key) override {
    return start(data, bytes, peer, key, false);
  }
  bool done(uint64_t request) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request);
    if (it == requests_.end()) return true;
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(it->second.size()), it->second.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      requests_.erase(it);
      throw PeerFailure("peer failure: an MPI point-to-point transfer failed (MPI error " + std::to_string(rc) + ")");
    }
    if (flag) requests_.erase(it);
    return flag != 0;
  }

 private:
  uint64_t start(void* data, size_t bytes, int peer, uint64_t key, bool send) {
    const int tag = static_cast<int>(key % static_cast<uint64_t>(tagLimit_));
    std::vector<MPI_Request> reqs;
    char* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes || (bytes == 0 && reqs.empty()); off += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, bytes - off));
      MPI_Request r;
      if (send) MPI_Isend(p + off, n, MPI_BYTE, peer, tag, comm_, &r);
      else MPI_Irecv(p + off, n, MPI_BYTE, peer, tag, comm_, &r);
      reqs.push_back(r);
      if (bytes == 0) break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    requests_[next_] = std::move(reqs);
    return next_++;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int tagLimit_ = 32767;
  std::mutex mu_;
  std::map<uint64_t, std::vector<MPI_Request>> requests_;
  uint64_t next_ = 1;
};

class MpiWorldImpl : public Bootstrap {
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

  std::unique_ptr<P2pBulk> p2pBulk() override { return std::make_unique<MpiBulk>(comm_); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Bootstrap> openMpiWorld(int64_t commHandle, bool needThreads) {
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

std::unique_ptr<Bootstrap> openMpiWorld(int64_t, bool) {
  throw InvalidArgument(
      "this chorus was built without MPI: install Open MPI (Debian libopenmpi-dev) and rebuild to run under "
      "mpirun, use MPI communicators or CHORUS_CPU_OPERATIONS=mpi; or start the job with chorusrun");
}

#endif

}  // namespace chorus
