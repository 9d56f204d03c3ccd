"""Synthetic training throughput, in the manner of Horovod's pytorch_synthetic_benchmark.py.

In one run it measures chorus (DistributedOptimizer) and the same model under
torch.nn.parallel.DistributedDataParallel (gloo) on the same ranks, alternating
iterations between them, and prints both and their ratio:

    chorusrun -np 2 python3 examples/pytorch/synthetic_benchmark.py --model mlp
    chorusrun -np 2 python3 examples/pytorch/synthetic_benchmark.py --model convnet --json out.json
"""
import argparse
import json
import os
import socket
import timeit

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import chorus.torch as hvd


class ManySmall(nn.Module):
    """Deep and narrow: many small parameter tensors, where fusion matters."""

    def __init__(self, depth=48, width=128, classes=10):
        super().__init__()
        self.inp = nn.Linear(3 * 32 * 32, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(depth)])
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        x = F.relu(self.inp(x.flatten(1)))
        for lin, norm in zip(self.layers, self.norms):
            x = x + F.relu(lin(norm(x)))
        return self.out(x)


class ConvNet(nn.Module):
    """A small residual conv net for 32x32 images."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        blocks = []
        c = width
        for stage, out_c in enumerate([width, 2 * width, 4 * width]):
            stride = 1 if stage == 0 else 2
            blocks += [nn.Conv2d(c, out_c, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out_c),
                       nn.ReLU(inplace=True), nn.Conv2d(out_c, out_c, 3, padding=1, bias=False),
                       nn.BatchNorm2d(out_c), nn.ReLU(inplace=True)]
            c = out_c
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.body(F.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make_model(name):
    if name == "mlp":
        return ManySmall()
    if name == "convnet":
        return ConvNet()
    try:
        import torchvision.models
        return getattr(torchvision.models, name)()
    except (ImportError, AttributeError):
        raise SystemExit(f"unknown model {name!r} (mlp, convnet, or a torchvision model if installed)")


def chorus_step(args, data, target):
    torch.manual_seed(0)
    model = make_model(args.model).to(data.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return step


def ddp_step(args, data, target):
    # Rank 0 picks a free port; chorus carries it to the others.
    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="ddp_port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size())
    torch.manual_seed(0)
    model = make_model(args.model).to(data.device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[data.device.index] if args.cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return step


def run(step, args):
    for _ in range(args.num_batches_per_iter):
        step()
    if args.cuda:  # (the GPU's work is what is timed, not its queueing)
        torch.cuda.synchronize()


def measure(steps, args, log):
    """Alternates the frameworks iteration by iteration, so that drift in the
    machine's speed affects both alike."""
    for step in steps.values():
        for _ in range(args.num_warmup_batches):
            step()
    rates = {name: [] for name in steps}
    for i in range(args.num_iters):
        for name, step in steps.items():
            hvd.barrier() if name == "chorus" else dist.barrier()
            t = timeit.timeit(lambda: run(step, args), number=1)
            rates[name].append(args.batch_size * args.num_batches_per_iter / t)
        log(f"Iter #{i}: " + ", ".join(f"{n} {r[-1]:.1f}" for n, r in rates.items()) +
            " img/sec per rank")
    return {name: (np.mean(r), 1.96 * np.std(r)) for name, r in rates.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", help="mlp (many small tensors), convnet, or torchvision name")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-cuda", action="store_true", help="run on the CPU even where a GPU is present")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:  # as Horovod's benchmark: one GPU per local rank (ranks may share one)
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.set_num_threads(args.threads)
    log = (lambda s: print(s, flush=True)) if hvd.rank() == 0 else (lambda s: None)
    torch.manual_seed(1 + hvd.rank())
    size = 224 if args.model not in ("mlp", "convnet") else 32
    device = torch.device("cuda" if args.cuda else "cpu")
    data = torch.randn(args.batch_size, 3, size, size).to(device)
    target = torch.randint(0, 10, (args.batch_size,)).to(device)
    log(f"Model: {args.model}, batch size: {args.batch_size}, ranks: {hvd.size()}, device: {device}")

    steps = {"chorus": chorus_step(args, data, target)}
    if not args.skip_ddp:
        steps["ddp"] = ddp_step(args, data, target)
    measured = measure(steps, args, log)
    results = []
    for name, (mean, ci) in measured.items():
        total, total_ci = hvd.size() * mean, hvd.size() * ci
        log(f"{name}: img/sec per rank: {mean:.1f} +-{ci:.1f}; total on {hvd.size()} ranks: "
            f"{total:.1f} +-{total_ci:.1f}")
        results.append({"framework": name, "ranks": hvd.size(), "model": args.model, "device": str(device),
                        "batch_size": args.batch_size, "img_per_sec_total": total, "ci": total_ci})
    if len(results) == 2:
        log(f"ratio chorus / ddp: {results[0]['img_per_sec_total'] / results[1]['img_per_sec_total']:.3f}")
    if "ddp" in steps:
        dist.destroy_process_group()
    if args.json and hvd.rank() == 0:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=2)
        os.replace(tmp, args.json)
    hvd.shutdown()


if __name__ == "__main__":
    main()
