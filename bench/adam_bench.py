"""chorus's CPU Adam vs torch.optim.Adam on the same parameters, in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/adam_bench.py --params 64M --json adam.json

Rows: impl (chorus | torch_foreach | torch_forloop | torch_fused), threads, params,
params_per_sec, and the ratio to torch's foreach Adam and to the memory floor
(Adam reads p, g, m, v and writes p, m, v: 28 bytes per fp32 parameter).
"""
import argparse
import json
import os
import time

import torch

from chorus import _core
from chorus.cpu_adam import CPUAdamState, adam_step


def parse_count(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if s[-1].isalpha() else s) * mult)


def timed(fn, steps):
    fn()  # warm-up: allocates state
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def memory_bandwidth(n):
    """Bytes per second moved by an in-place add (x += y: 8 bytes read, 4 written
    per element, no write-allocate traffic), the kind of access Adam makes."""
    x, y = torch.ones(n), torch.ones(n)
    t = timed(lambda: x.add_(y), 3)
    return 12 * n / t


def write_json(rows, path):
    """The rows as JSON, written to a temporary name and renamed (never half a file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=2)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="64M")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    n = parse_count(args.params)
    cores = os.cpu_count() or 1
    rows = []
    print(f"# Adam on {n} fp32 parameters; chorus kernel: {_core.adam_simd_level()}")
    print(f"# {'impl':>14} {'threads':>7} {'Gparam/s':>9} {'GB/s':>6} {'vs foreach':>10} {'floor frac':>10}")
    for threads in sorted({1, cores}):
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        floor = memory_bandwidth(n) / 28
        g = torch.randn(n)
        results = {}

        p = torch.randn(n)
        state = CPUAdamState(p)
        # chorus's kernel uses OpenMP; its thread count follows torch's here.
        results["chorus"] = timed(lambda: adam_step(p, g, state, lr=1e-3, weight_decay=0.01, adamw=True), args.steps)

        for impl, kwargs in [("torch_foreach", {"foreach": True}), ("torch_forloop", {"foreach": False}),
                             ("torch_fused", {"fused": True})]:
            q = torch.randn(n, requires_grad=True)
            q.grad = g
            try:
                opt = torch.optim.AdamW([q], lr=1e-3, weight_decay=0.01, **kwargs)
                results[impl] = timed(opt.step, args.steps)
            except (TypeError, RuntimeError, ValueError):
                continue  # this torch has no such implementation on CPU
        for impl, t in results.items():
            rate = n / t
            row = {"impl": impl, "threads": threads, "params": n, "params_per_sec": rate,
                   "gbytes_per_sec": rate * 28 / 1e9,
                   "ratio_vs_foreach": rate / (n / results["torch_foreach"]), "floor_fraction": rate / floor}
            rows.append(row)
            print(f"  {impl:>14} {threads:>7} {rate / 1e9:>9.3f} {rate * 28 / 1e9:>6.1f} {row['ratio_vs_foreach']:>10.2f} "
                  f"{row['floor_fraction']:>10.2f}")
    if args.json:
        write_json(rows, args.json)


if __name__ == "__main__":
    main()
