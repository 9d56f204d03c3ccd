"""ZeRO-Infinity's offload to disk (offload_optimizer device nvme, and at stage 3
offload_param nvme): every stage, fp32 and bf16 (with bf16 master weights), each optimizer chorus steps,
tiles smaller than a parameter and not on block boundaries, pipelined or not: the
same parameters, bit for bit, as the same config with the state in memory; then a
checkpoint saved from disk-held state (chorus's format and DeepSpeed's) resumes, in
memory and on disk, to the same continuation; then errors that name the folder."""
import os
import resource
import signal
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from zero_common import data, full_params, make_model, tmpdir, train

warnings.simplefilter("ignore")
hvd.init()
world = hvd.size()
STEPS = 4
swap = os.path.join(tmpdir(), "nvme")

OPTIMIZERS = {"adamw": {"type": "AdamW", "params": {"lr": 5e-3, "weight_decay": 0.01}},
              "adam-l2": {"type": "Adam", "params": {"lr": 5e-3, "weight_decay": 0.05, "adam_w_mode": False}},
              "lamb": {"type": "Lamb", "params": {"lr": 5e-3, "weight_decay": 0.01}},
              "lion": {"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.01}},
              "adagrad": {"type": "Adagrad", "params": {"lr": 5e-2}},
              "sgd": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}}


def config(stage, prec, opt, device, tile, pipeline=True, fmt=None, params=None, gas=1):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
           "optimizer": OPTIMIZERS[opt], "gradient_clipping": 0.5,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 700, "sub_group_size": tile,
                                 "stage3_param_persistence_threshold": 41,
                                 "offload_optimizer": {"device": device}},
           # Requests smaller than a tile and few in flight: the queue fills and drains.
           "aio": {"block_size": 4096, "queue_depth": 2}}
    if device == "nvme":
        cfg["zero_optimization"]["offload_optimizer"].update(
            {"nvme_path": swap, "pipeline_read": pipeline, "pipeline_write": pipeline})
    if params:  # stage 3's 16-bit slices: on disk ("disk"), or within max_in_cpu in memory ("kept")
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"} if device != "nvme" else {
            "device": "nvme", "nvme_path": swap, "buffer_size": tile, "max_in_cpu": 0 if params == "disk" else 10 ** 9}
    if prec == "bf16":
        cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": stage > 0}
    if fmt:
        cfg["checkpoint"] = {"format": fmt}
    return cfg


def run(cfg, x, y, steps=STEPS, tag=None):
    engine, _, _, _ = deepspeed.initialize(model=make_model(), config=cfg)
    losses = train(engine, x, y, steps)
    return engine, losses


NSTATES = {"adamw": 2, "adam-l2": 2, "lamb": 2, "lion": 1, "adagrad": 1, "sgd": 1}
x, y = data(4 * world, 2 * STEPS)
# (stage, precision, optimizer, tile elements, pipelined, stage 3's parameters): the model has 2243 parameters.
cases = [(0, "fp32", "adamw", 1000, True, None), (1, "bf16", "adamw", 300, True, None),
         (2, "fp32", "lamb", 257, False, None), (2, "bf16", "lion", 1024, True, None),
         (3, "fp32", "adagrad", 333, True, None), (3, "bf16", "adam-l2", 100, False, None),
         (1, "fp32", "sgd", 5000, True, None), (3, "bf16", "adamw", 300, True, "disk"),
         (3, "fp32", "lion", 700, False, "disk"), (3, "bf16", "lamb", 400, True, "disk"),
         (3, "bf16", "adamw", 300, True, "kept"),
         (3, "fp32", "adamw", 500, True, "disk", 2)]  # (2 micro-batches: stage 3's gradients added on disk)
for stage, prec, opt, tile, pipe, params, *more in cases:
    gas = more[0] if more else 1
    case = f"stage={stage} {prec} {opt} tile={tile} pipelined={pipe} params={params} gas={gas}"
    mem, mem_losses = run(config(stage, prec, opt, "cpu", tile, params=params, gas=gas), x, y)
    disk, disk_losses = run(config(stage, prec, opt, "nvme", tile, pipe, params=params, gas=gas), x, y)
    assert disk.core.state_on_disk and not mem.core.state_on_disk
    report, part = disk.core.memory(), disk.core.partition_elems
    # On disk: the master (unless an fp32 model's parameters are its master), the states, the slices;
    # at stage 3 the reduced gradients (in the model's dtype), as DeepSpeed swaps them.
    master_on_disk = not (prec == "fp32" and stage in (0, 3) and params != "disk")
    low = 2 if prec == "bf16" else 4
    want = 4 * part * (NSTATES[opt] + master_on_disk) + (part * low if params == "disk" else 0) + \
        (part * low if stage == 3 else 0)
    assert report["optimizer"] == 0 and want <= report["disk"] < want + 5 * 4096, (case, report, want)  # (each array in whole blocks)
    assert (report["params"] == 0) == (params == "disk"), (case, report)
    assert (report["grads"] == 0) == (stage == 3), (case, report)
    a = full_params(mem, tmpdir(), f"mem-{stage}-{prec}-{opt}")
    b = full_params(disk, tmpdir(), f"disk-{stage}-{prec}-{opt}")
    err = max((p - q).abs().max().item() for p, q in zip(a, b))
    if opt == "lamb":  # (a parameter's norms summed tile by tile: another order of the same sums)
        lerr = max(abs(p - q) for p, q in zip(mem_losses, disk_losses))
        assert err < 1e-6 and lerr < 1e-6, f"{case}: nvme differs from memory by {err} (losses {lerr})"
    else:  # elementwise updates: the same arithmetic, tile by tile
        assert err == 0.0 and mem_losses == disk_losses, f"{case}: nvme differs from memory by {err}"
    print(f"{case}: nvme == memory", flush=True)

# Checkpoints of disk-held state: both formats, resumed on disk and in memory.
for fmt in ("chorus", "deepspeed"):
    for stage in (1, 3):
        params = "disk" if stage == 3 else None  # (and stage 3's parameters on disk)
        cfg = config(stage, "bf16", "adamw", "nvme", 500, True, fmt, params)
        engine, _ = run(cfg, x, y)
        ckpt = os.path.join(tmpdir(), f"ckpt-{fmt}-{stage}")
        engine.save_checkpoint(ckpt, "t")
        cont = train(engine, x, y, 2 * STEPS, start=STEPS)
        for device in ("nvme", "cpu"):
            again, _, _, _ = deepspeed.initialize(model=make_model(seed=5),
                                                  config=config(stage, "bf16", "adamw", device, 500, True, fmt, params))
            again.load_checkpoint(ckpt, "t")
            got = train(again, x, y, 2 * STEPS, start=STEPS)
            assert got == cont, f"{fmt} stage {stage}: resumed on {device}: {got} != {cont}"
        print(f"checkpoint {fmt} stage={stage}: resumed from disk-held state", flush=True)

# Errors: no nvme_path; a path that cannot be a folder; an optimizer stepped in Python.
cfg = config(2, "fp32", "adamw", "nvme", 500)
del cfg["zero_optimization"]["offload_optimizer"]["nvme_path"]
try:
    deepspeed.initialize(model=make_model(), config=cfg)
    raise AssertionError("no nvme_path was accepted")
except ValueError as e:
    assert "nvme_path" in str(e), e
blocker = os.path.join(tmpdir(), f"not-a-folder-{hvd.rank()}")
open(blocker, "w").close()
cfg = config(2, "fp32", "adamw", "nvme", 500)
cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = os.path.join(blocker, "swap")
try:
    deepspeed.initialize(model=make_model(), config=cfg)
    raise AssertionError("an nvme_path under a file was accepted")
except RuntimeError as e:  # chorus.Error
    assert os.path.join(blocker, "swap") in str(e), e
cfg = config(3, "fp32", "adamw", "cpu", 500)
cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": swap}
try:
    deepspeed.initialize(model=make_model(), config=cfg)
    raise AssertionError("offload_param nvme was accepted beside offload_optimizer cpu")
except ValueError as e:
    assert "offload_optimizer.device' nvme" in str(e), e
cfg = config(2, "fp32", "adamw", "nvme", 500)
del cfg["optimizer"]
model = make_model()
try:
    deepspeed.initialize(model=model, optimizer=torch.optim.RMSprop(model.parameters()), config=cfg)
    raise AssertionError("a client optimizer was accepted with nvme offload")
except ValueError as e:
    assert "RMSprop" in str(e) and "nvme" in str(e), e
# A write that fails on one rank (rank 1's file-size limit below the swap files' offsets: EFBIG) is
# an error on every rank at that step, rank 1's naming the folder; the engine then refuses steps.
engine, _ = run(config(3, "fp32", "adamw", "nvme", 500, params="disk"), x, y, steps=1)
old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
if hvd.rank() == 1:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old_limit[1]))
try:
    train(engine, x, y, 2, start=1)
    raise AssertionError("a write that failed on rank 1 went unnoticed")
except RuntimeError as e:
    assert "the step did not complete" in str(e), e
    assert hvd.rank() == 0 or (swap in str(e) and "File too large" in str(e)), e
finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
try:
    train(engine, x, y, 3, start=2)
    raise AssertionError("the engine stepped again on a partly written state")
except RuntimeError as e:
    assert "load a checkpoint into a new engine" in str(e), e
del engine
assert not [f for f in os.listdir(swap)], f"swap files left behind: {os.listdir(swap)}"
print("zero nvme ok", flush=True)
sys.stdout.flush()
