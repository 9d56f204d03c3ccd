#pragma once
// The MPI job this process runs in. Reached only through this adapter, so that
// chorus builds and runs without MPI (mpi_world.cc is the one place that knows).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/point_to_point.h"

namespace chorus {

class MpiWorld {
 public:
  virtual ~MpiWorld() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether MPI runs at MPI_THREAD_MULTIPLE (calls from any thread at once).
  virtual bool threadsMultiple() const = 0;
  // Rank root's string on every rank.
  virtual std::string broadcastString(const std::string& s, int root) = 0;
  // Collective over every rank of the world: a communicator over `ranks` for
  // its members, null for the others.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& ranks) = 0;
  // Point-to-point payloads over a communicator of their own (collective: every rank calls it).
  virtual std::unique_ptr<P2pBulk> p2pBulk() = 0;
};

// Whether chorus was built with MPI.
bool mpiBuilt();
// Whether this process was started by mpirun (Open MPI, MPICH/PMI, PMIx).
bool launchedByMpi();
// Joins the MPI job (initializing MPI if nobody has). commHandle is a Fortran
// communicator handle (MPI_Comm_c2f, mpi4py's comm.py2f()), or -1 for
// MPI_COMM_WORLD. needThreads: collectives will be called from several threads,
// which MPI_THREAD_MULTIPLE must allow. Throws InvalidArgument when chorus was
// built without MPI or the thread level is too low.
std::unique_ptr<MpiWorld> openMpiWorld(int64_t commHandle, bool needThreads);

}  // namespace chorus
