"""MoE training under the engine at ep 1, 2 and 4 on 4 ranks, ZeRO 0/1/2: every
step's loss and the final weights equal one process holding every expert, trained
with torch's AdamW on the same global batch (the mean over the ranks' losses),
clipping by the whole model's norm."""
import copy
import json
import sys
import warnings

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.layer import MoE
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

warnings.simplefilter("ignore")
deepspeed.init_distributed(dist_init_required=False)
W, R = hvd.size(), hvd.rank()
E, M, C, MB, STEPS = 4, 8, 3, 8, 4


class Net(torch.nn.Module):
    def __init__(self, ep, k, drop):
        super().__init__()
        torch.manual_seed(0)
        self.fc_in = torch.nn.Linear(M, M)
        expert = torch.nn.Sequential(torch.nn.Linear(M, 12), torch.nn.Tanh(), torch.nn.Linear(12, M))
        self.moe = MoE(M, expert, num_experts=E, ep_size=ep, k=k, min_capacity=2, drop_tokens=drop, use_rts=False,
                       top2_2nd_expert_sampling=False)
        self.fc_out = torch.nn.Linear(M, C)
        L = E // ep
        for j, e in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):  # expert g: weights of its own
            g = torch.Generator().manual_seed(100 + (R % ep) * L + j)
            with torch.no_grad():
                for p in e.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x, y):
        h, l_aux, _ = self.moe(torch.tanh(self.fc_in(x)))
        return F.cross_entropy(self.fc_out(h), y) + 0.01 * l_aux


def batch(step, r):
    g = torch.Generator().manual_seed(10 * step + r)
    return torch.randn(MB, M, generator=g), torch.randint(0, C, (MB,), generator=g)


def reference(k, drop, clip, lr):
    """One process: every expert, every rank's micro-batch, torch's AdamW."""
    global R
    mine, R = R, 0  # build with every expert: ep 1 numbers them 0..E-1 as the layout does
    net = Net(1, k, drop)
    R = mine
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        per = []
        for r in range(W):
            loss = net(*batch(step, r))
            (loss / W).backward()
            per.append(float(loss))
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        losses.append(per)
    return net, losses


def close(a, b, what):
    assert torch.allclose(a, b, rtol=2e-4, atol=2e-5), f"rank {R}: {what}: {(a - b).abs().max()}"


cases = [(stage, ep, 1, True, 0.0) for stage in (0, 1, 2) for ep in (1, 2, 4)]
cases += [(2, 2, 2, False, 0.05), (1, 4, 2, True, 0.05), (0, 2, 1, False, 0.0)]
lr = 0.01
for stage, ep, k, drop, clip in cases:
    net = Net(ep, k, drop)
    cfg = {"train_micro_batch_size_per_gpu": MB, "gradient_clipping": clip,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 50}}
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
    assert engine.has_moe_layers
    ref, ref_losses = reference(k, drop, clip, lr)
    for step in range(STEPS):
        loss = engine(*batch(step, R))
        engine.backward(loss)
        engine.step()
        assert abs(float(loss) - ref_losses[step][R]) < 2e-4, (stage, ep, step, float(loss), ref_losses[step][R])
    what = f"stage={stage} ep={ep} k={k} drop={drop} clip={clip}"
    whole_params = dict(ref.named_parameters())
    for n, p in net.named_parameters():
        if "deepspeed_experts" not in n:
            close(p.data, whole_params[n].data, f"{n} {what}")
    L = E // ep
    whole = ref.moe.deepspeed_moe.experts.deepspeed_experts
    for j, e in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts):
        for (n, p), (_, q) in zip(e.named_parameters(), whole[(R % ep) * L + j].named_parameters()):
            close(p.data, q.data, f"expert {(R % ep) * L + j} {n} {what}")
    print(f"moe train ok rank {R} {what}", flush=True)
print(f"moe training ok rank {R}", flush=True)
