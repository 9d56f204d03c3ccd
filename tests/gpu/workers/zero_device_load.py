"""A checkpoint that zero_device.py's GPU engine saved at 2 ranks (stage 2,
bf16), loaded by one host engine (DS_ACCELERATOR=cpu): the parameters are the
GPU engine's, and training goes on.

    DS_ACCELERATOR=cpu chorusrun -np 1 python3 tests/gpu/workers/zero_device_load.py DIR
"""
import os
import sys

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from zero_device import config, mlp

torch.manual_seed(99)  # other initial values: the checkpoint must replace them
engine, _, _, _ = deepspeed.initialize(model=mlp(), config_params=config(2, "bf16", "none", 4))
assert engine.device.type == "cpu", engine.device
engine.load_checkpoint(sys.argv[1], tag="gpu")
saved = torch.load(os.path.join(sys.argv[1], "gpu_params.pt"))
for n, p in engine.module.named_parameters():
    assert torch.equal(p.detach(), saved[n]), n
x, y = torch.randn(4, 32), torch.randint(0, 10, (4,))
loss = F.cross_entropy(engine(x).float(), y)
engine.backward(loss)
engine.step()
assert torch.isfinite(loss), loss
print("zero device load ok", flush=True)
