"""A model whose optimizer state is larger than the memory this process may use
(the test runs it in a memory cgroup): bf16, ZeRO-3, AdamW; argv: nvme SWAP_DIR | memory
[LAYERS] (nvme: the optimizer's state, the reduced gradients and the 16-bit parameter slices on
disk, the model built under zero.Init(remote_device="nvme") so that it never exists whole in memory).
Trains, saves a checkpoint, takes one more step, loads the checkpoint and takes that step
again. Prints the losses, the bytes of optimizer state and the peak resident memory."""
import os
import resource
import sys
import warnings

import torch
import torch.nn as nn

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

warnings.simplefilter("ignore")
hvd.init()
# 24 layers: 101M parameters, 1.2 GB of fp32 master weights and AdamW moments
WIDTH, LAYERS, STEPS = 2048, int(sys.argv[3]) if len(sys.argv) > 3 else 24, 3


def make_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


cfg = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
       "zero_optimization": {"stage": 3, "sub_group_size": 2_000_000, "reduce_bucket_size": 5_000_000,
                             "stage3_max_live_parameters": 5_000_000, "stage3_prefetch_bucket_size": 5_000_000}}
if sys.argv[1] == "nvme":
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[2],
                                                     "pipeline_read": True, "pipeline_write": True}
    cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": sys.argv[2], "max_in_cpu": 0,
                                                 "buffer_size": 4_000_000}
# (built in bf16, a layer at a time partitioned: in memory, or with nvme on disk)
with deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="nvme" if sys.argv[1] == "nvme" else None):
    model = make_model()
engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
g = torch.Generator().manual_seed(1)
x = torch.randn(STEPS, 4, WIDTH, generator=g)
losses = []
def step(i):
    loss = (engine(x[i].to(torch.bfloat16)).float() - 0.5).pow(2).mean()
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())


for i in range(STEPS - 1):
    step(i)
ckpt = os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), f"ckpt-{sys.argv[1]}")
engine.save_checkpoint(ckpt, "t")  # (under nvme: the state streamed from its tiles to the file)
step(STEPS - 1)
engine.load_checkpoint(ckpt, "t")  # (and back, a tile at a time)
step(STEPS - 1)
assert losses[-1] == losses[-2], f"the step after loading differs: {losses[-2:]}"
print("losses:", repr(losses))
# fp32 master weights and AdamW's two moments: 12 bytes a parameter (on disk, or in memory)
print("state bytes:", 12 * LAYERS * (WIDTH * WIDTH + WIDTH))
print("peak rss bytes:", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)
