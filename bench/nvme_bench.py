"""ZeRO-Infinity's optimizer step with the state on disk against its bounds (issue 61):
the step with offload_optimizer device nvme (pipelined, and DeepSpeed's default of not
pipelining) beside the same step with the state in memory (the CPU Adam time), and the
disk's sequential read and write rates (dd with O_DIRECT, the same bytes, beside it).
Target: the pipelined step within 1.3x of max(read + write time of the state, in-memory step).

    PYTHONPATH=build/python build/venv-torch2/bin/python bench/nvme_bench.py [--params 100e6] [--dir /tmp/x]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def model_of(params, width=2048):
    torch.manual_seed(0)
    layers = max(1, int(round(params / (width * width + width))))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width).to(torch.bfloat16) for _ in range(layers)])


def engine_of(params, where, folder, pipelined=True, tile=16 << 20):
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 9, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 1, "sub_group_size": tile, "offload_optimizer": {"device": where}}}
    if where == "nvme":
        cfg["zero_optimization"]["offload_optimizer"].update(
            {"nvme_path": folder, "pipeline_read": pipelined, "pipeline_write": pipelined})
    engine, _, _, _ = deepspeed.initialize(model=model_of(params), config=cfg)
    return engine


def step_time(engine, steps):
    x = torch.randn(2, 2048).to(torch.bfloat16)
    times = []
    for _ in range(steps):
        engine.backward(engine(x).float().pow(2).mean())
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])  # (the first touches fresh pages)


def dd_rate(folder, nbytes):
    path = os.path.join(folder, "dd.bin")
    mb = max(1, nbytes >> 20)
    def run(args):
        out = subprocess.run(["dd", *args, "bs=1M", f"count={mb}"], capture_output=True, text=True, check=True).stderr
        return float(re.search(r"copied, ([0-9.]+) s", out).group(1))
    write = run(["if=/dev/zero", f"of={path}", "oflag=direct", "conv=fdatasync"])
    read = run([f"if={path}", "of=/dev/null", "iflag=direct"])
    os.unlink(path)
    return (mb << 20) / write, (mb << 20) / read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    hvd.init()
    folder = args.dir or tempfile.mkdtemp(prefix="chorus-nvme-bench.")
    os.makedirs(folder, exist_ok=True)
    results = {"memory": [], "nvme": [], "nvme_unpipelined": [], "write_rate": [], "read_rate": []}
    state = None
    for _ in range(args.rounds):  # interleaved: the VM's drift falls on all alike
        for name, where, pipe in (("memory", "cpu", True), ("nvme", "nvme", True), ("nvme_unpipelined", "nvme", False)):
            engine = engine_of(int(args.params), where, os.path.join(folder, "swap"), pipe)
            results[name].append(step_time(engine, args.steps))
            mem = engine.core.memory()
            state = mem["optimizer"] + mem["disk"]
            engine.destroy() if hasattr(engine, "destroy") else None
            del engine
        w, r = dd_rate(folder, state)
        results["write_rate"].append(w)
        results["read_rate"].append(r)
    med = {k: statistics.median(v) for k, v in results.items()}
    disk = state / med["read_rate"] + state / med["write_rate"]
    bound = max(disk, med["memory"])
    out = {"params": int(args.params), "state_bytes": state, "step_memory_s": med["memory"],
           "step_nvme_s": med["nvme"], "step_nvme_unpipelined_s": med["nvme_unpipelined"],
           "dd_write_MBps": med["write_rate"] / 1e6, "dd_read_MBps": med["read_rate"] / 1e6,
           "disk_read_plus_write_s": disk, "ratio_to_bound": med["nvme"] / bound}
    print("RESULT", json.dumps(out), flush=True)
    if not args.dir:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
