"""Allreduces for a while (STEADY_SECONDS), checking each result: a job that must
survive a lossy or stalled link to one host."""
import os
import time

import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
end = time.time() + float(os.environ.get("STEADY_SECONDS", "25"))
steps = 0
while time.time() < end or steps < 5:
    x = torch.full((16384,), float(r + 1))
    got = hvd.allreduce(x, op=hvd.Sum, name=f"s{steps % 4}")
    assert got[0].item() == n * (n + 1) / 2
    steps = hvd.broadcast_object(steps + 1, root_rank=0)  # every rank runs as many steps
    time.sleep(0.05)
print(f"steady rank {r} after {steps} steps", flush=True)
hvd.shutdown()
