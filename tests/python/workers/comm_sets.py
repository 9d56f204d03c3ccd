"""init() with process sets from MPI communicators, as Horovod's: the ids follow
the order of the list (at each place, the sets the ranks' communicators describe,
by their ranks); a set that one rank sees twice is a ValueError on that rank only,
raised once the sets are registered; init() with another list registers that one.
Run under mpirun -np 4."""
from mpi4py import MPI
import torch

import chorus.torch as hvd

world = MPI.COMM_WORLD
r = world.rank
halves = world.Split(color=r // 2, key=r)  # {0, 1} and {2, 3}
parity = world.Split(color=r % 2, key=r)  # {0, 2} and {1, 3}
sets = [hvd.ProcessSet(parity), hvd.ProcessSet(halves)]
hvd.init(world, process_sets=sets)
assert hvd.global_process_set.mpi_comm is world
ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks()
assert ids == {0: [0, 1, 2, 3], 1: [0, 2], 2: [1, 3], 3: [0, 1], 4: [2, 3]}, ids
assert (sets[0].process_set_id, sets[1].process_set_id) == (1 + r % 2, 3 + r // 2), sets
got = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=sets[0])
assert got.item() == (2.0 if r % 2 == 0 else 4.0), got  # 0 + 2, 1 + 3

# [0, 2] beside the parity sets: ranks 0 and 2 see it twice, ranks 1 and 3 do not.
try:
    hvd.init(world, process_sets=[hvd.ProcessSet(parity), hvd.ProcessSet([0, 2])])
    refused = False
except ValueError as e:
    assert "given twice" in str(e), e
    refused = True
assert refused == (r % 2 == 0), (r, refused)
ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks()
assert ids == {0: [0, 1, 2, 3], 1: [0, 2], 2: [1, 3]}, ids  # formed again on every rank
assert sets[0].process_set_id is None  # from the first list: no longer registered
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
assert total.item() == 4.0, total
world.barrier()
hvd.shutdown()
print(f"rank {r}: comm sets ok", flush=True)
