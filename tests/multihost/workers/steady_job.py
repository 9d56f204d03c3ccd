"""Allreduces for a while (STEADY_SECONDS), checking each result: a job that must
survive a lossy or stalled link to one host."""
import os
import time

import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
end = time.time() + float(os.environ.get("STEADY_SECONDS", "25"))
steps, go = 0, True
while go:
    x = torch.full((16384,), float(r + 1))
    got = hvd.allreduce(x, op=hvd.Sum, name=f"s{steps % 4}")
    assert got[0].item() == n * (n + 1) / 2
    steps += 1
    # Rank 0's clock decides for every rank: ranks started at different times.
    go = hvd.broadcast_object(time.time() < end or steps < 5, root_rank=0)
    time.sleep(0.05)
print(f"steady rank {r} after {steps} steps", flush=True)
hvd.shutdown()
