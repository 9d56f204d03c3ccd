"""Every collective and point-to-point op on tensors of CHORUS_TEST_DEVICE
("cuda", or "cpu" when CI checks this script itself), against float64
references computed here: float16, bfloat16, float32 (and integers for the
reductions), non-default streams, static and dynamic process sets.

    chorusrun -np 4 python3 tests/gpu/workers/collectives.py
"""
import os
import sys

import torch

import chorus.torch as hvd

DEVICE = os.environ.get("CHORUS_TEST_DEVICE", "cuda")
FLOATS = [torch.float16, torch.bfloat16, torch.float32]
TOL = {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-5, torch.float64: 1e-12}


def value(rank, n, dtype):
    """Rank r's tensor: small integers (exact in every dtype), times 0.5 for floats."""
    base = (torch.arange(n, dtype=torch.float64) * 3 + rank * 5) % 11 - 5
    return base * 0.5 if dtype.is_floating_point else base


def close(got, want, dtype, what):
    got = got.detach().to("cpu", torch.float64)
    tol = TOL.get(dtype, 0)
    err = (got - want).abs().max().item() if got.numel() else 0.0
    if err > tol * max(1.0, want.abs().max().item() if want.numel() else 1.0):
        raise AssertionError(f"rank {hvd.rank()}: {what}: max error {err} (dtype {dtype})")


def check_allreduce(dev, size, rank, stream=None):
    ops = [(hvd.Sum, lambda xs: sum(xs)), (hvd.Average, lambda xs: sum(xs) / len(xs)),
           (hvd.Min, lambda xs: torch.stack(xs).min(0).values), (hvd.Max, lambda xs: torch.stack(xs).max(0).values),
           (hvd.Product, None)]
    for dtype in FLOATS + [torch.int32, torch.int64]:
        for op, ref in ops:
            for n in (1, 7, 1031, 300007):
                if op == hvd.Product:  # products stay small: 1s and 2s
                    xs = [1 + (torch.arange(n, dtype=torch.float64) + r) % 2 for r in range(size)]
                    want = torch.stack(xs).prod(0)
                else:
                    xs = [value(r, n, dtype) for r in range(size)]
                    want = ref(xs)
                if op == hvd.Average and not dtype.is_floating_point:
                    want = torch.floor(sum(xs) / size)  # an integer average rounds down
                t = xs[rank].to(dtype).to(dev)
                got = hvd.allreduce(t, op=op, name=f"ar.{dtype}.{op}.{n}")
                close(got, want, dtype, f"allreduce {op} n={n}")
    # In place, grouped (fused), pre/postscale, on a non-default stream.
    xs = [[value(r, n, torch.float32) for n in (3, 513, 70000)] for r in range(size)]
    ts = [x.to(torch.float32).to(dev).clone() for x in xs[rank]]
    hvd.grouped_allreduce_(ts, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="grouped")
    for k, t in enumerate(ts):
        close(t, sum(x[k] for x in xs) * 1.5, torch.float32, f"grouped allreduce_ tensor {k}")


def check_others(dev, size, rank):
    for dtype in FLOATS:
        # allgather, uneven rows
        mine = value(rank, (rank + 1) * 3, dtype).reshape(rank + 1, 3)
        got = hvd.allgather(mine.to(dtype).to(dev), name=f"ag.{dtype}")
        want = torch.cat([value(r, (r + 1) * 3, dtype).reshape(r + 1, 3) for r in range(size)])
        close(got, want, dtype, "allgather")
        # grouped allgather
        gs = hvd.grouped_allgather([mine.to(dtype).to(dev), mine[:1].to(dtype).to(dev)], name=f"gag.{dtype}")
        close(gs[1], torch.cat([value(r, (r + 1) * 3, dtype).reshape(r + 1, 3)[:1] for r in range(size)]), dtype,
              "grouped allgather")
        # broadcast from the last rank, in place and out of place
        root = size - 1
        b = value(rank, 1000, dtype).to(dtype).to(dev)
        out = hvd.broadcast(b, root_rank=root, name=f"bc.{dtype}")
        close(out, value(root, 1000, dtype), dtype, "broadcast")
        hvd.broadcast_(b, root_rank=root, name=f"bc_.{dtype}")
        close(b, value(root, 1000, dtype), dtype, "broadcast_")
        # alltoall: rank r sends j + 1 rows to rank j
        rows = [value(rank * 100 + j, (j + 1) * 2, dtype).reshape(j + 1, 2) for j in range(size)]
        got, received = hvd.alltoall(torch.cat(rows).to(dtype).to(dev),
                                     splits=torch.tensor([j + 1 for j in range(size)]), name=f"a2a.{dtype}")
        want = torch.cat([value(r * 100 + rank, (rank + 1) * 2, dtype).reshape(rank + 1, 2) for r in range(size)])
        close(got, want, dtype, "alltoall")
        assert received.tolist() == [rank + 1] * size, received
        # reducescatter of 2n + 1 rows (uneven)
        total = 2 * size + 1
        xs = [value(r, total * 4, dtype).reshape(total, 4) for r in range(size)]
        got = hvd.reducescatter(xs[rank].to(dtype).to(dev), op=hvd.Sum, name=f"rs.{dtype}")
        start = sum(total // size + (r < total % size) for r in range(rank))
        mine_rows = total // size + (rank < total % size)
        close(got, sum(xs)[start:start + mine_rows], dtype, "reducescatter")
        gr = hvd.grouped_reducescatter([xs[rank].to(dtype).to(dev)], op=hvd.Average, name=f"grs.{dtype}")
        close(gr[0], (sum(xs) / size)[start:start + mine_rows], dtype, "grouped reducescatter")


def check_p2p(dev, size, rank):
    if size < 2:
        return
    peer = rank ^ 1
    if peer >= size:
        return
    mine = value(rank, 5000, torch.float32).to(torch.float32).to(dev)
    into = torch.empty(5000, device=dev)
    ops = [hvd.P2POp(hvd.isend, mine, peer), hvd.P2POp(hvd.irecv, into, peer)]
    for w in hvd.batch_isend_irecv(ops):
        w.wait()
    close(into, value(peer, 5000, torch.float32), torch.float32, "batch_isend_irecv")
    if rank % 2 == 0:
        hvd.send(mine, peer)
    else:
        got = torch.empty(5000, device=dev)
        hvd.recv(got, peer)
        close(got, value(peer, 5000, torch.float32), torch.float32, "send/recv")


def main():
    # CHORUS_TEST_STATIC_SETS=1: the even ranks' set is given to init (static);
    # otherwise it is added at run time (dynamic).
    static = os.environ.get("CHORUS_TEST_STATIC_SETS") == "1"
    n = int(os.environ.get("CHORUS_SIZE", "1"))
    given = hvd.ProcessSet(list(range(0, n, 2))) if static and n >= 2 else None
    hvd.init(process_sets=[given] if given is not None else "dynamic")
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    dev = torch.device(DEVICE)
    size, rank = hvd.size(), hvd.rank()
    check_allreduce(dev, size, rank)
    check_others(dev, size, rank)
    check_p2p(dev, size, rank)
    if DEVICE == "cuda":
        # The same on a stream of the caller's: chorus waits for it, and results are
        # ordered on it (a slow kernel first makes a missed wait visible).
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            big = torch.ones(1 << 22, device=dev) * (rank + 1)
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before the data is final
            big.mul_(2)
            got = hvd.allreduce(big, op=hvd.Sum, name="on_stream")
            got2 = got * 1  # queued on s after the result
        torch.cuda.synchronize()
        want = float(sum(2 * (r + 1) for r in range(size)))
        assert torch.all(got2 == want).item(), f"rank {rank}: non-default stream: {got2[:4]} != {want}"
        print(f"rank {rank}: path {hvd.stats()['gpu_path']} ({hvd.stats()['gpu_path_reason']})", flush=True)
    # Process sets: a static-style set of the even ranks and a dynamic one added now.
    if size >= 2:
        evens = given if given is not None else hvd.add_process_set(list(range(0, size, 2)))
        if rank % 2 == 0:
            x = value(rank, 999, torch.float32).to(dev)
            got = hvd.allreduce(x, op=hvd.Sum, process_set=evens, name="evens")
            close(got, sum(value(r, 999, torch.float32) for r in range(0, size, 2)), torch.float32, "process set")
            got = hvd.allgather(x[:3].reshape(1, 3), process_set=evens, name="evens.ag")
            assert got.shape[0] == len(range(0, size, 2))
        if given is None:
            hvd.remove_process_set(evens)
    hvd.barrier()
    if rank == 0:
        print(f"collectives on {DEVICE} OK on {size} ranks", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", flush=True)
        sys.exit(1)
