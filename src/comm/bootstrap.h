#pragma once
// How a job started by another launcher (mpirun) learns its ranks, and the
// backend services that come with that launcher. The core sees only this
// interface; src/comm/mpi implements it (and chorus builds without MPI).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/point_to_point.h"

namespace chorus {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the launcher's runtime allows calls from any thread at once (MPI_THREAD_MULTIPLE).
  virtual bool threadsMultiple() const = 0;
  // Rank root's string on every rank.
  virtual std::string broadcastString(const std::string& s, int root) = 0;
  // Collective over every rank of the job: a communicator over `ranks` for its
  // members, null for the others.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& ranks) = 0;
  // Point-to-point payloads over a channel of their own (collective: every rank calls it).
  virtual std::unique_ptr<P2pBulk> p2pBulk() = 0;
};

// The launcher that started this process, when chorus has a bootstrap for it
// ("mpi": mpirun of Open MPI, MPICH/PMI, PMIx), else "".
std::string launcherBootstrap();
// Joins the job of that launcher. handle: a communicator of it to restrict the
// job to (MPI: a Fortran handle, mpi4py's comm.py2f()), -1 for its world.
// needThreads: collectives will be called from several threads. Throws
// InvalidArgument when chorus was built without that backend, or it cannot.
std::unique_ptr<Bootstrap> openBootstrap(const std::string& kind, int64_t handle, bool needThreads);

}  // namespace chorus
