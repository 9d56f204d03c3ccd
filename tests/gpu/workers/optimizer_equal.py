"""hvd.DistributedOptimizer on a CUDA model gives the parameters of the same
run on the CPU (same seed, data and ranks), within float32 tolerance; with
fp16 compression, within fp16's. Also broadcast_parameters,
broadcast_optimizer_state and broadcast_object on CUDA state.

    chorusrun -np 2 python3 tests/gpu/workers/optimizer_equal.py
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import chorus.torch as hvd

DEVICE = os.environ.get("CHORUS_TEST_DEVICE", "cuda")


def train(device, compression, steps=12):
    torch.manual_seed(123 + hvd.rank())  # different on purpose: the broadcast fixes it
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression,
                                   backward_passes_per_step=2)
    g = torch.Generator().manual_seed(7 + hvd.rank())
    for _ in range(steps):
        for _ in range(2):  # two backward passes per step
            x = torch.randn(16, 32, generator=g).to(device)
            y = torch.randint(0, 10, (16,), generator=g).to(device)
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().to("cpu") for p in model.parameters()]


def main():
    hvd.init()
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    for compression, tol in ((hvd.Compression.none, 1e-4), (hvd.Compression.fp16, 2e-2)):
        on_dev = train(DEVICE, compression)
        on_cpu = train("cpu", compression)
        for a, b in zip(on_dev, on_cpu):
            err = (a - b).abs().max().item()
            if err > tol:
                print(f"FAILED: rank {hvd.rank()}: {DEVICE} and cpu parameters differ by {err} ({compression})")
                sys.exit(1)
        # replicas agree
        flat = torch.cat([p.flatten() for p in on_dev])
        gathered = hvd.allgather(flat.reshape(1, -1).to(DEVICE), name=f"replicas.{compression.__name__}")
        assert torch.equal(gathered[0], gathered[-1]), "replicas differ"
    state = hvd.broadcast_object({"step": hvd.rank(), "t": torch.arange(3.0, device=DEVICE) + hvd.rank()}, root_rank=0)
    assert state["step"] == 0 and state["t"].tolist() == [0.0, 1.0, 2.0], state
    if hvd.rank() == 0:
        print(f"optimizer on {DEVICE} equals cpu", flush=True)
    hvd.shutdown()


main()
