"""Started by a test as torchrun, Slurm or nothing would start it: no chorusrun.
Checks rank and size against what the starter set, an allreduce against its sum,
and (--dist) that torch.distributed forms its own group beside chorus."""
import os
import sys

import torch

import chorus.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
expected = os.environ.get(os.environ.get("EXPECT_RANK_FROM", "EXPECT_RANK"), "0")
assert rank == int(expected), (rank, expected)
assert size == int(os.environ.get("EXPECT_SIZE", "1")), (size, os.environ.get("EXPECT_SIZE"))
total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
assert total == size * (size + 1) / 2, total
hvd.init()  # a second init while initialised is a no-op, as Horovod's
if "--dist" in sys.argv:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == total, (t.item(), total)
    assert dist.get_rank() == rank and dist.get_world_size() == size
    dist.destroy_process_group()
print(f"ok rank {rank} size {size} local_rank {hvd.local_rank()} local_size {hvd.local_size()}", flush=True)
hvd.shutdown()
