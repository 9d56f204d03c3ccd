"""Each rank's bytes of model states under ZeRO stages 0-3, against the ZeRO
paper's figures for mixed-precision Adam (16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N).

    ./build/chorusrun -np 2 /usr/bin/python3 bench/zero_memory.py --params 100M [--check] [--json F]

The model is a stack of bf16 Linear layers with about --params parameters. The
engine's report counts its own buffers (parameters, gradients, fp32 master and
Adam state); fixed buffers (reduce buckets, gathered stage-3 parameters, scratch)
are reported beside them. rss is the growth of the process's resident memory
over initialize() and one training step, for an outside view.
"""
import argparse
import gc
import json
import resource
import sys
import warnings

import torch
import torch.nn as nn

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def parse_count(s):
    mult = {"K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if s[-1].isalpha() else s) * mult)


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def model_of(params, width=1024):
    layers = max(1, round(params / (width * width + width)))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="100M")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--check", action="store_true", help="fail unless model states are within 5%% of the formula")
    ap.add_argument("--json")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    rows = []
    for stage in [int(s) for s in args.stages.split(",")]:
        cfg = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
               "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
               "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e7,
                                     "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e4}}
        before = rss()
        model = model_of(parse_count(args.params), args.width)
        engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
        x = torch.randn(2, args.width)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
        m = engine.memory_report()
        grown = rss() - before
        row = {"stage": stage, "ranks": n, "rank": rank, "psi": m["psi"], "params": m["params"], "grads": m["grads"],
               "optimizer": m["optimizer"], "model_states": m["model_states"], "formula": m["formula"],
               "ratio": m["model_states"] / m["formula"], "fixed_buffers": m["fixed_buffers"], "rss_growth": grown}
        rows.append(row)
        if rank == 0:
            print(f"stage {stage} ranks {n}: Ψ={m['psi'] / 1e6:.1f}M  model states {m['model_states'] / 2**20:8.1f} MiB"
                  f"  formula {m['formula'] / 2**20:8.1f} MiB  ratio {row['ratio']:.3f}  "
                  f"(params {m['params'] / 2**20:.1f}, grads {m['grads'] / 2**20:.1f}, "
                  f"optimizer {m['optimizer'] / 2**20:.1f})  fixed {m['fixed_buffers'] / 2**20:.1f} MiB  "
                  f"rss +{grown / 2**20:.0f} MiB", flush=True)
        del engine, model
        gc.collect()  # the engine's hooks form cycles
        if args.check and abs(row["ratio"] - 1) > 0.05:
            print(f"stage {stage}: model states are {row['ratio']:.3f}x the ZeRO formula", file=sys.stderr)
            return 1
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
