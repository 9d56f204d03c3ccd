"""The same DeepSpeed program under the real DeepSpeed and under chorus (the venv's
`import deepspeed` alias): a model with MoE layers at ep 2 x dp 2 (moe: top-2; moe-top3: top-3; moe-muon: top-2 with the Muon optimizer), or with
Ulysses attention at sp 2 x dp 2 over a torch.distributed group (ulysses), under
ZeRO-2 on 4 ranks. Rank 0 prints 'step N loss X'.

    python moe_ulysses_peer.py moe|moe-top3|moe-muon|ulysses"""
import math
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

import deepspeed
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from deepspeed.sequence.layer import DistributedAttention

warnings.simplefilter("ignore")
MODE = sys.argv[1]
D, HEADS, SEQ, B = 16, 4, 8, 4


class MoENet(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.inp = torch.nn.Linear(D, D)
        expert = torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.GELU(), torch.nn.Linear(2 * D, D))
        self.moe = MoE(D, expert, num_experts=4, ep_size=2, k=k, min_capacity=2, top2_2nd_expert_sampling=False)
        self.out = torch.nn.Linear(D, 5)

    def forward(self, x, y):
        h, l_aux, _ = self.moe(torch.tanh(self.inp(x)))
        return F.cross_entropy(self.out(h), y) + 0.01 * l_aux


def attention(q, k, v):  # [s, b, h, d], causal
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    n = att.shape[-1]
    att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (att @ v).permute(2, 0, 1, 3)


class UlyssesNet(torch.nn.Module):
    def __init__(self, group):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.attn = DistributedAttention(attention, group)
        self.out = torch.nn.Linear(D, 5)

    def forward(self, x, y):  # x [s/2, b, D]
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, HEADS, D // HEADS).unbind(2)
        h = self.attn(q, k, v, 1).reshape(x.shape[0], x.shape[1], D)  # batch_dim_idx=1 (DeepSpeed >= 0.15)
        return F.cross_entropy(self.out(h).reshape(-1, 5), y.reshape(-1))


deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
cfg = {"train_micro_batch_size_per_gpu": B, "steps_per_print": 10 ** 9,
       "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.0}},
       "zero_optimization": {"stage": 2}}
if MODE == "moe-muon":  # Muon on the matrices, experts' too; AdamW on the rest
    cfg["optimizer"] = {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.9, "adam_lr": 1e-2}}
if MODE.startswith("moe"):
    model = MoENet(3 if MODE == "moe-top3" else 2)
    if MODE == "moe-muon":
        for name, p in model.named_parameters():  # (DeepSpeed's initialize tags them so; model_parameters need it first)
            p.use_muon = p.dim() >= 2
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                   "name": "all"})
else:
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    model = UlyssesNet(groups[rank // 2])
    params = model.parameters()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
for step in range(5):
    g = torch.Generator().manual_seed(10 * step + (rank if MODE.startswith("moe") else rank // 2))
    if MODE.startswith("moe"):
        x, y = torch.randn(B * 4, D, generator=g), torch.randint(0, 5, (B * 4,), generator=g)
    else:  # one sequence batch per sequence-parallel pair, this rank's half of the positions
        x, y = torch.randn(SEQ, B, D, generator=g), torch.randint(0, 5, (SEQ, B), generator=g)
        half = slice((rank % 2) * SEQ // 2, (rank % 2 + 1) * SEQ // 2)
        x, y = x[half], y[half]
    loss = engine(x, y)
    engine.backward(loss)
    engine.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
print(f"peer done rank {rank} {deepspeed.__file__}", flush=True)
