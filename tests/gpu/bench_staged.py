"""Staged allreduce of CUDA tensors (ranks sharing one GPU) beside, in the same
run: the pinned copy rate, chorus's allreduce of CPU tensors of the same size,
and torch.distributed's Gloo on the same CUDA tensors. Bus bandwidth as
nccl-tests reports it: algbw * 2(n-1)/n.

    chorusrun -np 4 python3 tests/gpu/bench_staged.py --json out.json
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

import chorus.torch as hvd


def timed(fn, iters, cuda):
    fn()  # warm-up
    if cuda:
        torch.cuda.synchronize()
    hvd.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 256])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    hvd.init()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    n, r = hvd.size(), hvd.rank()
    port = None
    if r == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="gloo_port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=n)
    rows = []
    for mib in a.sizes_mib:
        count = int(mib * (1 << 20)) // 4
        nbytes = count * 4
        x = torch.ones(count, device=dev)
        host = torch.ones(count)
        iters = max(2, a.iters if mib <= 64 else a.iters // 2)
        # pinned copy rate, rank 0 alone (device to host)
        copy = 0.0
        if cuda and r == 0:
            pinned = torch.empty(count, pin_memory=True)
            pinned.copy_(x, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                pinned.copy_(x, non_blocking=True)
            torch.cuda.synchronize()
            copy = nbytes * iters / (time.perf_counter() - t0) / 1e9
        hvd.barrier()
        bus = 2 * (n - 1) / n
        staged = nbytes / timed(lambda: hvd.allreduce_(x, op=hvd.Sum, name="staged"), iters, cuda) * bus / 1e9
        cpu = nbytes / timed(lambda: hvd.allreduce_(host, op=hvd.Sum, name="cpu"), iters, False) * bus / 1e9
        gloo = nbytes / timed(lambda: dist.all_reduce(x), iters, cuda) * bus / 1e9
        copy = hvd.broadcast_object(copy, root_rank=0, name=f"copy{mib}")
        if r == 0:
            bound = min(copy, cpu) if copy else cpu
            row = {"ranks": n, "mib": mib, "staged_busbw": staged, "pinned_copy_gbs": copy, "cpu_busbw": cpu,
                   "gloo_busbw": gloo, "vs_bound": staged / bound, "vs_gloo": staged / gloo}
            rows.append(row)
            print(f"{n} ranks {mib:>6} MiB: staged {staged:6.2f} GB/s busbw | pinned copy {copy:6.2f} GB/s | "
                  f"chorus cpu {cpu:6.2f} | gloo on cuda {gloo:6.2f} | staged/bound {row['vs_bound']:.2f} "
                  f"| staged/gloo {row['vs_gloo']:.2f}", flush=True)
    dist.destroy_process_group()
    if a.json and r == 0:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f, indent=2)
        os.replace(tmp, a.json)
    hvd.shutdown()


main()
