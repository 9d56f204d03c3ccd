"""chorus's SIMD CPU Lion and Adagrad (DeepSpeed's CPU Lion/Adagrad updates) against
torch's foreach versions on the same parameters, in one run: torch.optim.Adagrad
(foreach=True) and a Lion written with torch._foreach ops (torch has no Lion).

    PYTHONPATH=build/python build/venv-torch2/bin/python bench/cpu_optim_bench.py --params 64M --json optim.json

(torch 2: torch 1.13 has no _foreach_sign.)

Rows: optimizer, impl, threads, params_per_sec, the ratio to torch foreach, and the
fraction of the memory floor (each reads p, g, state and writes p, state: 20 bytes
per fp32 parameter).
"""
import argparse
import os

import torch

from adam_bench import memory_bandwidth, parse_count, timed, write_json
from chorus.deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from chorus.deepspeed.ops.lion import DeepSpeedCPULion


class ForeachLion(torch.optim.Optimizer):
    """Lion in torch's foreach ops (the lion-pytorch update)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            ps = [p for p in g["params"] if p.grad is not None]
            grads = [p.grad for p in ps]
            ms = [self.state[p].setdefault("exp_avg", torch.zeros_like(p)) for p in ps]
            b1, b2 = g["betas"]
            torch._foreach_mul_(ps, 1 - g["lr"] * g["weight_decay"])
            blend = torch._foreach_mul(ms, b1)
            torch._foreach_add_(blend, grads, alpha=1 - b1)
            torch._foreach_add_(ps, torch._foreach_sign(blend), alpha=-g["lr"])
            torch._foreach_mul_(ms, b2)
            torch._foreach_add_(ms, grads, alpha=1 - b2)


def makers():
    return {
        "lion": {"chorus": lambda q: DeepSpeedCPULion([q], lr=1e-4, weight_decay=0.01),
                 "torch_foreach": lambda q: ForeachLion([q], lr=1e-4, weight_decay=0.01)},
        "adagrad": {"chorus": lambda q: DeepSpeedCPUAdagrad([q], lr=1e-2, weight_decay=0.01),
                    "torch_foreach": lambda q: torch.optim.Adagrad([q], lr=1e-2, weight_decay=0.01, foreach=True)},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="64M")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    n = parse_count(args.params)
    rows = []
    print(f"# {n} fp32 parameters")
    print(f"# {'optimizer':>9} {'impl':>14} {'threads':>7} {'Gparam/s':>9} {'vs foreach':>10} {'floor frac':>10}")
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        floor = memory_bandwidth(n) / 20
        g = torch.randn(n)
        for name, impls in makers().items():
            times = {}
            for impl, make in impls.items():
                q = torch.randn(n, requires_grad=True)
                q.grad = g
                times[impl] = timed(make(q).step, args.steps)
            for impl, t in times.items():
                rate = n / t
                row = {"optimizer": name, "impl": impl, "threads": threads, "params": n, "params_per_sec": rate,
                       "ratio_vs_foreach": times["torch_foreach"] / t, "floor_fraction": rate / floor}
                rows.append(row)
                print(f"  {name:>9} {impl:>14} {threads:>7} {rate / 1e9:>9.3f} {row['ratio_vs_foreach']:>10.2f} "
                      f"{row['floor_fraction']:>10.2f}")
    if args.json:
        write_json(rows, args.json)


if __name__ == "__main__":
    main()
