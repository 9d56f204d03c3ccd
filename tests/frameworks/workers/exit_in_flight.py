"""A DeepSpeed program that ends with torch.distributed work still in flight:
asynchronous all_gathers whose handles it dropped, of tensors with Python state
(their Python objects live as long as torch's C++ side holds them). The program
must still exit, on every rank, promptly."""
import torch
import torch.distributed as dist

import deepspeed

deepspeed.init_distributed(dist_backend="gloo")
for i in range(400):
    t = torch.full((1 << 16,), float(dist.get_rank()))
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    for x in out + [t]:
        x.tag = i
    dist.all_gather(out, t, async_op=True)
del t, out, x
print("done", dist.get_rank(), flush=True)
