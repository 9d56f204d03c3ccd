"""A DeepSpeed script (only the import changed), run by the deepspeed-style
command line across 2 hosts: ZeRO-2, every rank ends with the same model."""
import socket

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
r = engine.global_rank
assert engine.world_size == 4, engine.world_size
g = torch.Generator().manual_seed(r)
for step in range(10):
    x = torch.randn(4, 8, generator=g)
    loss = torch.nn.functional.cross_entropy(engine(x), (x.sum(1) > 0).long())
    engine.backward(loss)
    engine.step()
flat = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
assert torch.equal(hvd.broadcast(flat, root_rank=0), flat)
print(f"ds rank {r} on {socket.gethostname()}: loss {loss.item():.4f}")
