"""torch.distributed's gloo group beside chorus, on the MASTER_ADDR/MASTER_PORT
chorusrun chose: one allreduce in each, checked."""
import torch
import torch.distributed as dist

import chorus.torch as hvd

hvd.init()
dist.init_process_group("gloo")
t = torch.ones(3) * (hvd.rank() + 1)
dist.all_reduce(t)
want = hvd.size() * (hvd.size() + 1) / 2
assert torch.equal(t, torch.full((3,), want)), t
assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [hvd.size()] * 2
print("ok", hvd.rank(), flush=True)
