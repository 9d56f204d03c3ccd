"""Pipeline stages re-cut and MoE experts re-placed through a universal checkpoint: a 7-layer
PipelineModule saved at pp 2 x dp 2 (ZeRO-1), or a model with a MoE layer of 4 experts saved
at ep 2 x dp 2 (ZeRO-2), in chorus's own format, written as a universal checkpoint (python -m
chorus.deepspeed.checkpoint universal: the stages together, every expert under its global
number), loads at other layouts. After loading, pipe: the loss on the next batch equals a plain
one-process nn.Sequential's from the universal checkpoint's whole weights; moe: every expert
this rank holds equals the saving run's expert of that global number, and the loss equals the
saving run's on that batch. Then the next steps' losses equal the saving layout's.

    universal_pipe_moe.py pipe|moe save DIR     (4 ranks: pp 2 or ep 2)
    universal_pipe_moe.py pipe|moe load DIR N   (pp N or ep N, the rest data-parallel)
Every rank trains on the same batch, so any data-parallel size computes the same step."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from chorus.deepspeed.pipe import PipelineModule
from moe_common import C, M, Net

D, H, OUT, LR = 8, 16, C, 0.01


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(D, H), torch.nn.Tanh(), torch.nn.Linear(H, H), torch.nn.Tanh(), torch.nn.Linear(H, H),
            torch.nn.Tanh(), torch.nn.Linear(H, OUT)]


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, D, generator=g), torch.randint(0, OUT, (8,), generator=g)


assert M == D  # (the MoE model's width: moe_common's)


def config(stage, universal):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage}, "checkpoint": {"load_universal": universal}}


def engine_of(kind, size, universal=False):
    if kind == "pipe":
        module = PipelineModule(layers=layers(), num_stages=size, partition_method="parameters",
                                loss_fn=torch.nn.CrossEntropyLoss())
        engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                               config=config(1, universal))
        return engine
    model = Net(size, 2, True, hvd.rank() % size)  # (its experts with weights of their own, by global number)
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
    cfg = dict(config(2, universal), gradient_accumulation_steps=1, train_micro_batch_size_per_gpu=8)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    return engine


def micro(step):
    x, y = batch(step)
    return iter([(x[:4], y[:4]), (x[4:], y[4:])])


def train(kind, engine, first, n):
    out = []
    for step in range(first, first + n):
        if kind == "pipe":
            out.append(float(engine.train_batch(micro(step))))
        else:
            loss = engine(*batch(step))
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
    return out


def experts(engine):
    """{global name: value} of the experts this rank holds."""
    from chorus.deepspeed.runtime.zero.ds_checkpoint import expert_names
    return {g: p.detach().clone() for part in engine._expert_parts
            for g, p in zip(expert_names(engine, part), part.params)}


kind, mode, folder = sys.argv[1], sys.argv[2], sys.argv[3]
deepspeed.init_distributed()
if mode == "save":
    engine = engine_of(kind, 2)
    train(kind, engine, 0, 3)
    engine.save_checkpoint(os.path.join(folder, "ckpt"), tag="t")
    held = experts(engine) if kind == "moe" else {}
    with torch.no_grad():
        first = float(engine.eval_batch(micro(3))) if kind == "pipe" else engine(*batch(3)).item()
    went_on = train(kind, engine, 3, 3)
    every = {}
    for part in hvd.allgather_object(held, name="held"):
        every.update(part)
    if hvd.rank() == 0:
        from chorus.deepspeed.checkpoint.__main__ import to_universal
        to_universal(os.path.join(folder, "ckpt"), os.path.join(folder, "uni"))
        torch.save(every, os.path.join(folder, "experts.pt"))
        with open(os.path.join(folder, "went_on.json"), "w") as f:
            json.dump({"first": first, "went_on": went_on}, f)
    hvd.barrier()
else:
    size = int(sys.argv[4])
    engine = engine_of(kind, size, universal=True)
    engine.load_checkpoint(os.path.join(folder, "uni"))
    with open(os.path.join(folder, "went_on.json")) as f:
        want = json.load(f)
    uni = os.path.join(folder, "uni", "t", "zero")
    if kind == "pipe":  # the plain model from the universal checkpoint's whole weights (as DeepSpeed reads them)
        plain = torch.nn.Sequential(*layers())
        plain.load_state_dict({n: torch.load(os.path.join(uni, n, "fp32.pt"))["param"]
                               for n, _ in plain.named_parameters()})
        with torch.no_grad():
            ours = float(engine.eval_batch(micro(3)))
            theirs = F.cross_entropy(plain(batch(3)[0]), batch(3)[1]).item()
    else:
        saved = torch.load(os.path.join(folder, "experts.pt"))
        mine = experts(engine)
        assert mine and all(torch.equal(v, saved[g]) for g, v in mine.items()), sorted(mine)
        assert all(torch.equal(v, torch.load(os.path.join(uni, g, "fp32.pt"))["param"]) for g, v in mine.items())
        with torch.no_grad():
            ours, theirs = engine(*batch(3)).item(), want["first"]
    assert abs(ours - theirs) <= 1e-5, (kind, size, ours, theirs)
    got = train(kind, engine, 3, 3)
    worst = max(abs(a - b) for a, b in zip(got, want["went_on"]))
    assert worst <= 1e-5, (kind, size, got, want)
    print(f"universal {kind} {size} x dp {hvd.size() // size} ok (loss {ours:.6f} = {theirs:.6f}; "
          f"3 steps within {worst:.1e})", flush=True)
