"""One MoE training run under chorus.deepspeed or DeepSpeed: a Transformer-style
block stack whose feed-forward layers are DeepSpeed MoE layers, expert-parallel
x data-parallel under ZeRO, the same model, config, data and seed; only the
import differs. Every rank prints one `PEERS_RESULT {json}` line with the loss of
every step, ms per step and peak RSS.

    chorusrun -np 4 python moe.py --framework chorus --ep 2
    DS_ACCELERATOR=cpu RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python moe.py --framework deepspeed --ep 2

Top-2 gating without the second expert's noise, dropping by position: deterministic
in both, so the losses can be compared step for step."""
import argparse
import os
import resource
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import report  # noqa: E402


def build(deepspeed, args):
    from_moe = __import__(deepspeed.__name__ + ".moe.layer", fromlist=["MoE"])

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(args.width)
            self.mix = torch.nn.Linear(args.width, args.width)
            expert = torch.nn.Sequential(torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                                         torch.nn.Linear(4 * args.width, args.width))
            self.moe = from_moe.MoE(args.width, expert, num_experts=args.experts, ep_size=args.ep, k=2,
                                    capacity_factor=1.0, min_capacity=4, drop_tokens=True,
                                    top2_2nd_expert_sampling=False)

        def forward(self, x):
            x = x + torch.tanh(self.mix(self.norm(x)))
            h, l_aux, _ = self.moe(x)
            return x + h, l_aux

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(args.width, args.width)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(args.depth)])
            self.out = torch.nn.Linear(args.width, 10)

        def forward(self, x, y):
            x, aux = self.inp(x), 0.0
            for b in self.blocks:
                x, l_aux = b(x)
                aux = aux + l_aux
            return F.cross_entropy(self.out(x).reshape(-1, 10), y.reshape(-1)) + 0.01 * aux

    return Net()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["chorus", "deepspeed"], required=True)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="per rank and step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--expert-times", help="write each expert forward's seconds here (JSON; %%r: the rank)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.framework == "chorus":
        import chorus.deepspeed as deepspeed
    else:
        import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    from_utils = __import__(deepspeed.__name__ + ".moe.utils", fromlist=["x"])
    torch.manual_seed(0)
    model = build(deepspeed, args)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.0}},
           "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6,
                                 "overlap_comm": True, "contiguous_gradients": True}}
    groups = from_utils.split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "all"})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    expert_times = []
    if args.expert_times:  # each layer's experts' forward, timed (bench/moe_timeline.py reads them)
        for block in model.blocks:
            experts = block.moe.deepspeed_moe.experts
            forward = experts.forward

            def timed(x, forward=forward):
                start = time.perf_counter()
                out = forward(x)
                expert_times.append((start, time.perf_counter() - start))
                return out
            experts.forward = timed
    gen = torch.Generator().manual_seed(1 + rank)
    total = args.warmup + args.steps
    data = torch.randn(total, args.tokens, args.width, generator=gen)
    teacher = torch.randn(args.width, 10, generator=torch.Generator().manual_seed(99))
    target = (data @ teacher).argmax(-1)
    losses, times = [], []
    for i in range(total):
        start = time.perf_counter()
        loss = engine(data[i], target[i])
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    timed = sorted(times[args.warmup:])
    if args.expert_times:
        import json
        with open(args.expert_times.replace("%r", str(rank)), "w") as f:
            json.dump(expert_times, f)
    report({"rank": rank, "ranks": size, "framework": args.framework, "ep": args.ep, "stage": args.stage,
            "losses": losses, "ms_per_step": 1000 * timed[len(timed) // 2],
            "ms_per_step_mean": 1000 * sum(timed) / len(timed),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__})


if __name__ == "__main__":
    main()
