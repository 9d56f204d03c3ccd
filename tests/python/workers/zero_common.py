"""Shared by the ZeRO workers: a small model, deterministic data and a plain
single-process reference of what the engine must compute."""
import copy
import os

import torch
import torch.nn as nn

IN, HID, OUT = 12, 40, 3


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, OUT))


def data(global_batch, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * global_batch, IN, generator=g)
    y = torch.randint(0, OUT, (steps * global_batch,), generator=g)
    return x, y


def chunk(x, y, step, micro, rank, micro_batch, world, gas):
    """The micro-batch a rank trains on: the global batch of a step is laid out
    micro-step by micro-step, rank by rank."""
    base = step * micro_batch * world * gas + micro * micro_batch * world + rank * micro_batch
    return x[base:base + micro_batch], y[base:base + micro_batch]


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.float(), y)


def scheduled_lr(sched, it):
    """DeepSpeed's WarmupLR / WarmupDecayLR after `it` scheduler steps (-1: none yet)."""
    import math
    p = sched["params"]
    lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 1e-3)
    warm = max(2, p.get("warmup_num_steps", 1000))
    if it < 0:
        return lo
    if it < warm:
        gamma = math.log(it + 1) / math.log(warm) if p.get("warmup_type", "log") == "log" else it / warm
    elif sched["type"] == "WarmupDecayLR":
        gamma = max(0.0, (p["total_num_steps"] - it) / max(1.0, p["total_num_steps"] - warm))
    else:
        gamma = 1.0
    return lo + (hi - lo) * gamma


def reference(model, cfg, dtype, x, y, steps, world):
    """Single process: low-precision forward/backward per micro-batch, fp32 master
    weights, torch's optimizer, gradient clipping by global norm."""
    model = copy.deepcopy(model).to(dtype)
    params = [p for p in model.parameters()]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    o = cfg["optimizer"]
    kind, hp = o["type"].lower(), o["params"]
    if kind == "adam" and hp.get("adam_w_mode", True):
        kind = "adamw"  # DeepSpeed's Adam decouples weight decay by default
    if kind == "adam":
        opt = torch.optim.Adam(master, lr=hp["lr"], weight_decay=hp.get("weight_decay", 0.0))
    elif kind == "adamw":
        opt = torch.optim.AdamW(master, lr=hp["lr"], weight_decay=hp.get("weight_decay", 0.0))
    else:
        opt = torch.optim.SGD(master, lr=hp["lr"], momentum=hp.get("momentum", 0.0))
    mb, gas = cfg["train_micro_batch_size_per_gpu"], cfg.get("gradient_accumulation_steps", 1)
    losses = []
    for step in range(steps):
        acc = [torch.zeros_like(m) for m in master]
        for micro in range(gas):
            for r in range(world):
                xb, yb = chunk(x, y, step, micro, r, mb, world, gas)
                model.zero_grad()
                loss = loss_fn(model(xb.to(dtype)), yb)
                (loss / (gas * world)).backward()
                for a, p in zip(acc, params):
                    a += p.grad.float()
                if micro == gas - 1:
                    losses.append(loss.item())
        for m, a in zip(master, acc):
            m.grad = a
        if "scheduler" in cfg:
            for g in opt.param_groups:
                g["lr"] = scheduled_lr(cfg["scheduler"], step - 1)
        if cfg.get("gradient_clipping", 0) > 0:
            torch.nn.utils.clip_grad_norm_(master, cfg["gradient_clipping"])
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m.to(dtype))
    return master, losses


def train(engine, x, y, steps, start=0):
    """Runs the engine; returns each step's last micro-batch loss per rank."""
    import chorus.torch as hvd
    ps = engine.process_set
    mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses = []
    for step in range(start, steps):
        for micro in range(gas):
            xb, yb = chunk(x, y, step, micro, ps.rank(), mb, ps.size(), gas)
            loss = loss_fn(engine(xb), yb)
            engine.backward(loss)
            engine.step()
        losses.append(loss.item())
    return losses


def full_params(engine, tmp, tag):
    """The engine's fp32 master weights, consolidated through a checkpoint."""
    import chorus.torch as hvd
    from chorus.deepspeed.utils.zero_to_fp32 import consolidate
    engine.save_checkpoint(tmp, tag)
    sd = consolidate(tmp, tag)
    return [sd[n] for n in engine._names]


def tmpdir():
    return os.environ["ZERO_TMP"]
