"""The flops profiler on one model, as a user calls it: get_model_profile's totals and
printout, and an engine whose config has flops_profiler (printout at profile_step to a
file). Runs under whatever `import deepspeed` is (the real DeepSpeed or chorus); the test
compares the two and the totals with hand counts.

    flops_profile.py OUT_DIR
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import deepspeed
from deepspeed.profiling.flops_profiler import get_model_profile

B, T, D, H = 2, 5, 16, 2  # batch, tokens, width, heads


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (D // H) ** 0.5
        y = torch.matmul(F.softmax(scores, dim=-1), v)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(D, D, kernel_size=3, padding=1)
        self.norm = nn.LayerNorm(D)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
        x = x + self.attn(self.norm(x))
        x = x + self.mlp(x)
        return self.head(x.mean(dim=1))


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(B, T, D)
    flops, macs, params = get_model_profile(net, args=[x], print_profile=True, detailed=True, warm_up=1,
                                            as_string=False, output_file=os.path.join(out, "profile.txt"))
    deepspeed.init_distributed()
    cfg = {"train_micro_batch_size_per_gpu": B, "steps_per_print": 100,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": -1, "top_modules": 2,
                              "detailed": True, "output_file": os.path.join(out, "engine.txt")}}
    engine, _, _, _ = deepspeed.initialize(model=Net(), config=cfg)
    for _ in range(4):
        engine.backward(engine(x).square().mean())
        engine.step()
    with open(os.path.join(out, "totals.json"), "w") as f:
        json.dump({"flops": flops, "macs": macs, "params": params}, f)


if __name__ == "__main__":
    main()
