"""A Horovod training script (only the import changed) that also checks where
its ranks run: 2 hosts x 2 ranks, hosts filled in order."""
import os
import socket
import sys

import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
host = socket.gethostname()
assert n == 4 and hvd.local_size() == 2 and hvd.cross_size() == 2, (n, hvd.local_size(), hvd.cross_size())
assert host == f"node{r // 2 + 1}", (r, host)  # ranks 0-1 on node1, 2-3 on node2
assert hvd.local_rank() == r % 2 and hvd.cross_rank() == r // 2
# Every rank's host name, gathered across the link.
names = hvd.allgather_object(host)
assert names == ["node1", "node1", "node2", "node2"], names
for var in sys.argv[1:]:  # NAME=VALUE the launcher must have passed on; NAME! one it must not
    if var.endswith("!"):  # have passed to another host (ranks on the launcher's host inherit all)
        assert host == "node1" or var[:-1] not in os.environ, f"{var[:-1]} reached rank {r}"
    else:
        k, v = var.split("=", 1)
        assert os.environ.get(k) == v, f"rank {r}: {k}={os.environ.get(k)!r}, expected {v!r}"

# A small model trained data-parallel; every rank ends with the same parameters.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(r)
for step in range(20):
    x = torch.randn(32, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
assert torch.equal(hvd.broadcast(flat, root_rank=0), flat)
big = hvd.allreduce(torch.full((300000,), float(r)), op=hvd.Sum)  # past the small-message path
assert torch.all(big == 6.0)
print(f"rank {r} of {n} on {host}: trained, loss {loss.item():.4f}")
