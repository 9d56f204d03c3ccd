"""MoE training under the engine at ep 1, 2 and 4 on 4 ranks, ZeRO 0/1/2: every
step's loss and the final weights equal one process holding every expert, trained
with torch's AdamW on the same global batch (the mean over the ranks' losses),
clipping by the whole model's norm."""
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from moe_common import E, MB, Net, batch

warnings.simplefilter("ignore")
deepspeed.init_distributed(dist_init_required=False)
W, R = hvd.size(), hvd.rank()
STEPS = 4


def reference(k, drop, clip, lr, opt_type):
    """One process: every expert, every rank's micro-batch, torch's AdamW or SGD."""
    net = Net(1, k, drop, 0)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01) if opt_type == "AdamW" else \
        torch.optim.SGD(net.parameters(), lr=lr)
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


# (stage, ep, k, drop, clip, optimizer). SGD: a wrong gradient scale or norm shows at once
# (Adam's update hardly moves with a constant scale of the gradients).
data_first = sys.argv[1:] == ["--data-first"]  # DeepSpeed's use_data_before_expert_parallelism (D + E)
if data_first:
    cases = [(2, 2, 1, True, 0.3, "SGD"), (1, 2, 2, False, 0.0, "AdamW")]
else:
    cases = [(stage, ep, 1, True, 0.0, "AdamW") for stage in (0, 1, 2) for ep in (1, 2, 4)]
    cases += [(2, 2, 2, False, 0.05, "AdamW"), (1, 4, 2, True, 0.05, "AdamW"), (0, 2, 1, False, 0.0, "AdamW"),
              (2, 2, 1, True, 0.3, "SGD"), (0, 4, 2, False, 0.0, "SGD")]
for stage, ep, k, drop, clip, opt_type in cases:
    lr = 0.01 if opt_type == "AdamW" else 0.2
    ep_rank = R // (W // ep) if data_first else R % ep  # D + E: the expert-parallel sets are strided
    net = Net(ep, k, drop, ep_rank)
    cfg = {"train_micro_batch_size_per_gpu": MB, "gradient_clipping": clip,
           "optimizer": {"type": opt_type, "params": {"lr": lr, "weight_decay": 0.01 if opt_type == "AdamW" else 0}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
           "use_data_before_expert_parallelism": data_first}
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
    assert engine.has_moe_layers
    # The experts' optimizer states (fp32 master and Adam's two moments) partitioned over
    # the W/ep ranks holding the same experts at stages 1-2 (each bucket's slices padded).
    part = engine._expert_parts[0]
    assert part.data_set.size() == W // ep and part.ep_set.size() == ep
    numel = sum(p.numel() for p in part.params)
    held = part.core.memory()["optimizer"]
    if stage > 0 and opt_type == "AdamW":  # (an fp32 model's master is its parameters at stage 0)
        assert 8 * numel / (W // ep) <= held and (held < 12 * numel or W // ep == 1), (held, numel)
    elif opt_type == "AdamW":  # Adam's two moments of every expert parameter
        assert held >= 8 * numel, (held, numel)
    if data_first:
        assert part.ep_set.ranks == [R % 2, R % 2 + 2] and part.data_set.ranks == [R - R % 2, R - R % 2 + 1]
    ref, ref_losses = reference(k, drop, clip, lr, opt_type)
    for step in range(STEPS):
        loss = engine(*batch(step, R))
        engine.backward(loss)
        engine.step()
        assert abs(float(loss) - ref_losses[step][R]) < 2e-4, (stage, ep, step, float(loss), ref_losses[step][R])
    what = f"stage={stage} ep={ep} k={k} drop={drop} clip={clip} {opt_type}"
    whole_params = dict(ref.named_parameters())
    for n, p in net.named_parameters():
        if "deepspeed_experts" not in n:
            close(p.data, whole_params[n].data, f"{n} {what}")
    L = E // ep
    whole = ref.moe.deepspeed_moe.experts.deepspeed_experts
    for j, e in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts):
        for (n, p), (_, q) in zip(e.named_parameters(), whole[ep_rank * L + j].named_parameters()):
            close(p.data, q.data, f"expert {ep_rank * L + j} {n} {what}")
    print(f"moe train ok rank {R} {what}", flush=True)
print(f"moe training ok rank {R}", flush=True)
