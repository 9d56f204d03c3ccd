"""One framework's data-parallel training run, for bench/peers/run.py. The chorus and
Horovod runs are the same program with only the import changed; DDP is the same model
wrapped in DistributedDataParallel; "local" trains each rank alone with no exchange
(the ceiling that compute sets on this machine). Every rank prints one `PEERS_RESULT {json}` line.

    chorusrun -np 2 python3 train.py --framework chorus --model deep_mlp
    horovodrun --gloo -np 2 -H localhost:2 python train.py --framework horovod --model deep_mlp
    python3 -m torch.distributed.run --nproc_per_node 2 train.py --framework ddp --model deep_mlp
"""
import argparse
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS, report  # noqa: E402


def sgd(model, size):
    # The learning rate scaled by the ranks, as Horovod's examples do.
    return torch.optim.SGD(model.parameters(), lr=0.001 * size, momentum=0.9)


def setup(framework, model):
    """Returns (rank, size, the model to train, its optimizer, a barrier)."""
    if framework in ("chorus", "horovod"):
        if framework == "chorus":
            import chorus.torch as hvd
        else:
            import horovod.torch as hvd
        hvd.init()
        optimizer = hvd.DistributedOptimizer(sgd(model, hvd.size()), named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return hvd.rank(), hvd.size(), model, optimizer, lambda: hvd.allreduce(torch.zeros(1), name="barrier")
    if framework == "local":  # no exchange at all: the compute-bound ceiling
        size = int(os.environ["WORLD_SIZE"])
        return int(os.environ["RANK"]), size, model, sgd(model, size), lambda: None
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)
    return dist.get_rank(), dist.get_world_size(), model, sgd(model, dist.get_world_size()), dist.barrier


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["chorus", "horovod", "ddp", "local"], required=True)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = MODELS[args.model]()
    rank, size, model, optimizer, barrier = setup(args.framework, model)
    gen = torch.Generator().manual_seed(1 + rank)
    data = torch.randn(args.batch_size, 3, 32, 32, generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    barrier()
    seconds = time.perf_counter() - start
    report({
        "rank": rank, "ranks": size, "framework": args.framework, "model": args.model,
        "samples_per_sec": args.batch_size * size * args.steps / seconds, "seconds": seconds,
        "steps": args.steps, "loss": loss, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch": torch.__version__})
    if args.framework == "ddp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
