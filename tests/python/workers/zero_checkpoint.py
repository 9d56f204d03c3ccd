"""Checkpoints: resuming gives the same losses as an uninterrupted run (same world
size); `save` / `resume` modes move a checkpoint to another world size; a damaged
shard is refused by name."""
import os
import shutil
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from zero_common import data, full_params, make_model, reference, tmpdir, train

warnings.simplefilter("ignore")
hvd.init()
world, rank = hvd.size(), hvd.rank()
mode = sys.argv[1]
GLOBAL, STEPS, HALF = 12, 6, 3


def config(stage, prec="fp32"):
    cfg = {"train_batch_size": GLOBAL, "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "weight_decay": 0.01}},
           "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 5e-3, "warmup_num_steps": 2,
                                                               "total_num_steps": 10}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 500,
                                 "stage3_param_persistence_threshold": 41}}
    if prec != "fp32":
        cfg[prec] = {"enabled": True}
    return cfg


x, y = data(GLOBAL, STEPS)
tmp = tmpdir()
if mode == "same":
    for stage in (0, 1, 2, 3):
        for prec in ("fp32", "bf16"):
            whole, _, _, _ = deepspeed.initialize(model=make_model(), config=config(stage, prec))
            expect = train(whole, x, y, STEPS)
            first, _, _, _ = deepspeed.initialize(model=make_model(), config=config(stage, prec))
            before = train(first, x, y, HALF)
            d = os.path.join(tmp, f"same-{stage}-{prec}")
            first.save_checkpoint(d, client_state={"epoch": 7})
            second, _, _, _ = deepspeed.initialize(model=make_model(seed=5), config=config(stage, prec))
            path, client = second.load_checkpoint(d)
            assert client == {"epoch": 7} and path.endswith(f"global_step{HALF}"), (path, client)
            after = train(second, x, y, STEPS, start=HALF)
            assert before + after == expect, f"stage {stage} {prec}: resumed {before + after} != {expect}"
            assert second.global_steps == STEPS and second.get_lr() == whole.get_lr()
            print(f"resume stage={stage} {prec}: same losses", flush=True)
    # A damaged shard is reported by name and never loaded.
    d = os.path.join(tmp, "same-2-fp32", f"global_step{HALF}")
    victim = os.path.join(d, "zero_rank_00001_optim_states.chorus")
    hvd.barrier()
    for damage in ("truncate", "flip"):
        bad = os.path.join(tmp, f"bad-{damage}-{rank}")
        shutil.copytree(os.path.dirname(d), bad)
        target = os.path.join(bad, f"global_step{HALF}", os.path.basename(victim))
        raw = bytearray(open(target, "rb").read())
        raw = raw[: len(raw) // 2] if damage == "truncate" else raw[:100] + bytes([raw[100] ^ 1]) + raw[101:]
        open(target, "wb").write(bytes(raw))
        eng, _, _, _ = deepspeed.initialize(model=make_model(), config=config(2))
        try:
            eng.load_checkpoint(bad)
            raise AssertionError(f"a {damage}d shard was loaded")
        except RuntimeError as e:
            assert os.path.basename(victim) in str(e) and ("truncated" in str(e) or "corrupted" in str(e)), str(e)
        print(f"{damage} shard refused", flush=True)
    print("zero checkpoint ok", flush=True)
elif mode == "save":  # the first half on this world size
    for stage in (1, 2, 3):
        eng, _, _, _ = deepspeed.initialize(model=make_model(), config=config(stage))
        train(eng, x, y, HALF)
        eng.save_checkpoint(os.path.join(tmp, f"moved-{stage}"))
    print("zero save ok", flush=True)
elif mode == "resume":  # the second half on another world size
    cfg = config(1)
    cfg["train_micro_batch_size_per_gpu"] = GLOBAL
    ref, _ = reference(make_model(), cfg, torch.float32, x, y, STEPS, 1)
    for stage in (1, 2, 3):
        eng, _, _, _ = deepspeed.initialize(model=make_model(seed=9), config=config(stage))
        eng.load_checkpoint(os.path.join(tmp, f"moved-{stage}"))
        train(eng, x, y, STEPS, start=HALF)
        got = full_params(eng, tmp, f"moved-check-{stage}")
        err = max((a - b).abs().max().item() for a, b in zip(got, ref))
        print(f"stage={stage}: resumed on {world} ranks, max error vs reference {err:.2e}", flush=True)
        assert err < 1e-5, err
    print("zero resume ok", flush=True)
