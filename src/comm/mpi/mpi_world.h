#pragma once
// The MPI job this process runs in, as a Bootstrap (comm/bootstrap.h). Reached
// only through the comm factory, so that chorus builds and runs without MPI
// (mpi_world.cc is the one place that knows).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"

namespace chorus {

// Whether chorus was built with MPI.
bool mpiBuilt();
// Whether this process was started by mpirun (Open MPI, MPICH/PMI, PMIx).
bool launchedByMpi();
// Joins the MPI job (initializing MPI if nobody has). commHandle is a Fortran
// communicator handle (MPI_Comm_c2f, mpi4py's comm.py2f()), or -1 for
// MPI_COMM_WORLD. needThreads: collectives will be called from several threads,
// which MPI_THREAD_MULTIPLE must allow. Throws InvalidArgument when chorus was
// built without MPI or the thread level is too low.
std::unique_ptr<Bootstrap> openMpiWorld(int64_t commHandle, bool needThreads);

}  // namespace chorus
