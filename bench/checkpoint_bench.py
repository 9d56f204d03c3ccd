"""What a checkpoint costs, measured side by side in one run (issue 61's targets):

  save  (under chorusrun, chorus): the disk's sequential write rate (dd with fdatasync,
        beside it, the same bytes), a blocking save_checkpoint, and an asynchronous one:
        how long it stalls the step (the copy into memory) and the rate its background
        thread writes at; rounds interleaved so the VM's drift falls on all alike.
  load  (under chorusrun with chorus, or torchrun with the real DeepSpeed): load_checkpoint
        of a folder the real DeepSpeed saved, timed in a fresh engine.
  ds-save (the real DeepSpeed): that folder.

    PYTHONPATH=build/python build/chorusrun -np 1 --python build/venv-torch2/bin/python \\
        bench/checkpoint_bench.py save --params 85e6 --dir /tmp/ckb
    bash bench/checkpoint_bench.sh     (all of it, the real DeepSpeed's load beside chorus's)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

import deepspeed


def model_of(params):
    width = 2048
    layers = max(1, int(round(params / (width * width + width))))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def engine_of(params, stage, extra=None):
    model = model_of(params)
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": stage}}
    cfg.update(extra or {})
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    return engine, model


def one_step(engine):
    x = torch.randn(2, 2048)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def dd_rate(path, nbytes):
    """MB/s of dd writing nbytes with fdatasync (the disk's sequential rate, as its users measure it)."""
    count = max(1, nbytes // (64 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=64M", f"count={count}", "conv=fdatasync"],
                   check=True, capture_output=True)
    secs = time.perf_counter() - t0
    os.unlink(path)
    return count * (64 << 20) / secs / 1e6


def save(a):
    from chorus.deepspeed.runtime.zero import checkpoint_io
    engine, _ = engine_of(a.params, a.stage)
    one_step(engine)
    rows = {"blocking_s": [], "async_stall_s": [], "async_write_MBps": [], "dd_MBps": [], "step_s": []}
    nbytes = 0
    for r in range(a.rounds):
        target = os.path.join(a.dir, f"r{r}")
        t0 = time.perf_counter()
        engine.save_checkpoint(os.path.join(target, "blocking"), tag="t")
        rows["blocking_s"].append(time.perf_counter() - t0)
        nbytes = folder_bytes(os.path.join(target, "blocking"))
        rows["dd_MBps"].append(dd_rate(os.path.join(a.dir, "dd.bin"), nbytes))
        t0 = time.perf_counter()
        engine.save_checkpoint(os.path.join(target, "async"), tag="t", async_save=True)
        rows["async_stall_s"].append(time.perf_counter() - t0)
        snap = engine._pending_save.snapshot
        t0 = time.perf_counter()
        one_step(engine)  # a step while the files are written
        rows["step_s"].append(time.perf_counter() - t0)
        engine.wait_for_checkpoint()
        rows["async_write_MBps"].append(nbytes / snap.seconds / 1e6)
        shutil.rmtree(target)
    med = {k: statistics.median(v) for k, v in rows.items()}
    out = {"params": sum(p.numel() for p in engine.module.parameters()), "checkpoint_bytes": nbytes,
           "stage": a.stage, "rounds": a.rounds, **{k: round(v, 4) for k, v in med.items()},
           "async_stall_each_s": [round(t, 4) for t in rows["async_stall_s"]],  # (the first allocates the buffer)
           "stall_over_blocking": round(med["async_stall_s"] / med["blocking_s"], 4),
           "async_write_over_dd": round(med["async_write_MBps"] / med["dd_MBps"], 3)}
    print("RESULT " + json.dumps(out), flush=True)


def ds_save(a):
    engine, _ = engine_of(a.params, a.stage)
    one_step(engine)
    engine.save_checkpoint(a.dir, tag="t")
    print("saved", folder_bytes(os.path.join(a.dir, "t")), flush=True)


def load(a):
    times = []
    for _ in range(a.rounds):
        engine, _ = engine_of(a.params, a.stage)
        t0 = time.perf_counter()
        engine.load_checkpoint(a.dir, tag="t")
        times.append(time.perf_counter() - t0)
        del engine
    who = "chorus" if "chorus" in deepspeed.__file__ else "deepspeed"
    print("RESULT " + json.dumps({"loader": who, "load_s": round(statistics.median(times), 4),
                                  "all_s": [round(t, 4) for t in times]}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("save", "ds-save", "load"))
    ap.add_argument("--params", type=float, default=85e6)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    a.params = int(a.params)
    os.makedirs(a.dir, exist_ok=True)
    {"save": save, "ds-save": ds_save, "load": load}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
