"""Ranks with less data join early; their peers' allreduces see zeros from them."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
for step in range(r + 1):
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"step{step}")
    assert got.tolist() == [float(n - step)] * 3, (step, got)
assert hvd.join() == n - 1
hvd.shutdown()
print(f"rank {r}: join ok")
