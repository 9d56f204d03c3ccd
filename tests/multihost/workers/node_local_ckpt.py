"""checkpoint.use_node_local_storage across 2 hosts: each node saves to its own disk
(here BASE/<hostname>, as if the same path were a local disk on each node): the first
rank of each node writes the model states, every rank its shard; each node's folder holds
its own ranks' shards only, and a resumed run (each rank reading only its own shard)
trains on exactly as the uninterrupted one. A load at another size is refused by name.

    node_local_ckpt.py BASE STAGE
"""
import os
import socket
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def make(stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": stage}, "checkpoint": {"use_node_local_storage": True}}
    engine, _, _, _ = deepspeed.initialize(model=model, config=config)
    return engine


def steps(engine, batches):
    out = []
    for x in batches:
        loss = torch.nn.functional.cross_entropy(engine(x), (x.sum(1) > 0).long())
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


base, stage = sys.argv[1], int(sys.argv[2])
folder = os.path.join(base, socket.gethostname())
g = torch.Generator().manual_seed(hvd.rank() if hvd.is_initialized() else 0)
first = make(stage)
data = [torch.randn(4, 8, generator=g) for _ in range(6)]
steps(first, data[:3])
first.save_checkpoint(folder, tag="t")
want = steps(first, data[3:])
files = sorted(os.listdir(os.path.join(folder, "t")))
mine = [f for f in files if f.startswith("zero_rank_")]
local = [r for r in range(hvd.size()) if r // hvd.local_size() == hvd.rank() // hvd.local_size()]
expected = [f"zero_rank_{r:05d}_optim_states.chorus" for r in local] if stage > 0 else \
    ["zero_rank_00000_optim_states.chorus"]
assert mine == expected, (socket.gethostname(), files)
assert "model_states.chorus" in files and os.path.exists(os.path.join(folder, "latest")), files
resumed = make(stage)
resumed.load_checkpoint(folder)
got = steps(resumed, data[3:])
assert max(abs(a - b) for a, b in zip(want, got)) < 1e-7, (want, got)
print(f"node-local rank {hvd.rank()} on {socket.gethostname()}: resumed as it was", flush=True)
