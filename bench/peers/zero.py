"""One ZeRO training run under chorus.deepspeed or DeepSpeed, for bench/peers/run.py:
the same model, config, data and seed; only the import differs. Every rank prints one
`PEERS_RESULT {json}` line with the loss of every step, ms per step and peak RSS.

    chorusrun -np 2 python3 zero.py --framework chorus --stage 2
    DS_ACCELERATOR=cpu RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python zero.py --framework deepspeed --stage 2
"""
import argparse
import os
import resource
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ZeroMLP, report  # noqa: E402


def config(args):
    cfg = {"train_micro_batch_size_per_gpu": args.batch_size, "gradient_accumulation_steps": 1,
           "steps_per_print": 10 ** 9, "wall_clock_breakdown": False,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                    "weight_decay": 0.0}},
           "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6,
                                 "stage3_prefetch_bucket_size": 5e6, "stage3_param_persistence_threshold": 1e4,
                                 "overlap_comm": True, "contiguous_gradients": True}}
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if args.offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return cfg


def batches(width, batch_size, steps, rank):
    """Rank's inputs and labels for every step; labels from a fixed random teacher, so
    that the loss falls and a wrong update shows."""
    gen = torch.Generator().manual_seed(1 + rank)
    data = torch.randn(steps, batch_size, width, generator=gen)
    teacher = torch.randn(width, 10, generator=torch.Generator().manual_seed(99))
    return data, (data @ teacher).argmax(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["chorus", "deepspeed"], required=True)
    ap.add_argument("--stage", type=int, choices=[1, 2, 3], required=True)
    ap.add_argument("--offload", action="store_true", help="optimizer state offloaded to the CPU")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--steps", type=int, default=20, help="steps timed, and losses recorded")
    ap.add_argument("--warmup", type=int, default=0, help="untimed steps before them (also in the losses)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    if args.framework == "chorus":
        import chorus.deepspeed as deepspeed
    else:
        import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = ZeroMLP(args.width, args.depth)
    params = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(args))
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    total = args.warmup + args.steps
    data, target = batches(args.width, args.batch_size, total, rank)
    losses, times = [], []
    for i in range(total):
        start = time.perf_counter()
        out = engine(data[i].to(dtype))
        loss = F.cross_entropy(out.float(), target[i])
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    timed = sorted(times[args.warmup:])
    report({
        "rank": rank, "ranks": size, "framework": args.framework, "stage": args.stage,
        "offload": args.offload, "dtype": args.dtype, "losses": losses,
        "ms_per_step": 1000 * timed[len(timed) // 2], "ms_per_step_mean": 1000 * sum(timed) / len(timed),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "params": params,
        "torch": torch.__version__})


if __name__ == "__main__":
    main()
