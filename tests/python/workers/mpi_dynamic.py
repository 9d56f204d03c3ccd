"""Dynamic process sets from Split communicators, under mpirun."""
import torch
from mpi4py import MPI

import chorus.torch as hvd

world = MPI.COMM_WORLD
hvd.init(world, process_sets="dynamic")
r = hvd.rank()
# The job runs in mpi4py's world, which asks for MPI_THREAD_MULTIPLE.
assert hvd.mpi_enabled() and hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
sub = world.Split(color=r % 2, key=r)  # evens and odds
ps = hvd.add_process_set(hvd.ProcessSet(sub))
assert ps.ranks == [k for k in range(hvd.size()) if k % 2 == r % 2], ps.ranks
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=ps)
assert total.item() == len(ps.ranks)
hvd.remove_process_set(ps)
hvd.barrier()
hvd.shutdown()
print(f"rank {r}: mpi dynamic ok", flush=True)
