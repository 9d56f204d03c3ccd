"""Every stage x precision x offload: N engine steps match the single-process
reference with the same global batch (and gradient accumulation, clipping)."""
import os
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from zero_common import data, full_params, loss_fn, make_model, reference, tmpdir, train

warnings.simplefilter("ignore")
hvd.init()
world = hvd.size()
STEPS = 5
precisions = ["fp32", "bf16"]
try:
    torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
    precisions.append("fp16")  # this torch computes fp16 on the CPU
except RuntimeError:
    pass

cases = []
for stage in (0, 1, 2, 3):
    for prec in precisions:
        for offload in (False, True):
            cases.append((stage, prec, offload, "adam", 1, 0.0))
# Accumulation, clipping and the other optimizers, at a few stages.
cases += [(1, "fp32", False, "adamw", 2, 0.0), (2, "fp32", True, "adam", 3, 0.5), (3, "fp32", False, "sgd", 2, 0.0),
          (3, "bf16", True, "adamw", 2, 0.05), (0, "fp32", False, "sgd", 1, 1e-3), (2, "fp32", False, "adam-l2", 2, 0.0)]

for stage, prec, offload, opt, gas, clip in cases:
    mb = 4
    cfg = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": gas,
           "optimizer": {"type": opt, "params": {"lr": 5e-3, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 700,
                                 "stage3_param_persistence_threshold": 41}}
    if opt == "sgd":
        cfg["optimizer"]["params"] = {"lr": 0.05, "momentum": 0.9}
    if opt == "adam-l2":  # Adam with L2 weight decay, not DeepSpeed's default decoupled decay
        cfg["optimizer"] = {"type": "Adam", "params": {"lr": 5e-3, "weight_decay": 0.05, "adam_w_mode": False}}
    if clip:
        cfg["gradient_clipping"] = clip
    if prec != "fp32":
        cfg[prec] = {"enabled": True}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[prec]
    x, y = data(mb * world * gas, STEPS)
    model = make_model()
    ref_master, ref_losses = reference(model, cfg, dtype, x, y, STEPS, world)
    engine, _, _, _ = deepspeed.initialize(model=make_model(), model_parameters=None, config=cfg)
    losses = train(engine, x, y, STEPS)
    got = full_params(engine, tmpdir(), f"parity-{stage}-{prec}-{offload}-{opt}-{gas}")
    err = max((a - b).abs().max().item() for a, b in zip(got, ref_master))
    scale = max(b.abs().max().item() for b in ref_master)
    tol = 2e-5 if prec == "fp32" else 3e-2
    rank_loss = ref_losses[hvd.rank()::world]
    lerr = max(abs(a - b) for a, b in zip(losses, rank_loss))
    case = f"stage={stage} {prec} offload={offload} {opt} gas={gas} clip={clip}"
    assert err <= tol * max(scale, 1.0), f"{case}: parameters differ from the reference by {err:.3g}"
    assert lerr <= (1e-4 if prec == "fp32" else 5e-2), f"{case}: losses differ by {lerr:.3g}"
    print(f"{case}: max param error {err:.2e}, loss error {lerr:.2e}", flush=True)
# Accumulation: 3 micro-batches of 2 per step train exactly like one micro-batch of 6.
for stage in (1, 2, 3):
    results = []
    for mb, gas in ((2, 3), (6, 1)):
        cfg = {"train_batch_size": 6 * world, "train_micro_batch_size_per_gpu": mb,
               "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": stage}}
        engine, _, _, _ = deepspeed.initialize(model=make_model(), config=cfg)
        x, y = data(6 * world, STEPS)
        for step in range(STEPS):
            for micro in range(gas):  # this rank's rows of the step, in micro-batches
                base = step * 6 * world + hvd.rank() * 6 + micro * mb
                engine.backward(loss_fn(engine(x[base:base + mb]), y[base:base + mb]))
                engine.step()
        results.append(full_params(engine, tmpdir(), f"accum-{stage}-{mb}"))
    err = max((a - b).abs().max().item() for a, b in zip(*results))
    assert err < 1e-6, f"stage {stage}: accumulated and big-batch training differ by {err}"
    print(f"stage={stage}: 3 x 2 accumulated == 1 x 6, max difference {err:.1e}", flush=True)
print("zero parity ok", flush=True)
