"""Every dtype Horovod carries, through every collective, against values computed here."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]
if hasattr(torch, "uint16"):
    DTYPES.append(torch.uint16)


def data(rank, shape, dt):
    g = torch.Generator().manual_seed(77 + rank)
    t = torch.randint(0, 2, shape, generator=g) if dt == torch.bool else torch.randint(0, 9, shape, generator=g)
    return t.to(dt)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.to(torch.float64), b.to(torch.float64))


for dt in DTYPES:
    every = [data(k, (4 * n, 3), dt) for k in range(n)]
    mine = every[r]
    wide = torch.stack([e.to(torch.float64) for e in every])
    # Sum of bools is "any", as Horovod's and torch.distributed's are.
    for op, ref in [(hvd.Sum, wide.sum(0) if dt != torch.bool else wide.amax(0)),
                    (hvd.Min, wide.amin(0)), (hvd.Max, wide.amax(0))]:
        got = hvd.allreduce(mine, op=op, name=f"ar.{dt}.{op}")
        assert got.dtype == dt and torch.equal(got.to(torch.float64), ref), (dt, op, got, ref)
    grouped = hvd.grouped_allreduce([mine, mine[:1]], op=hvd.Max, name=f"gar.{dt}")
    assert torch.equal(grouped[1].to(torch.float64), wide.amax(0)[:1])

    ragged = data(r, (r + 1, 2), dt)
    got = hvd.allgather(ragged, name=f"ag.{dt}")
    assert same(got, torch.cat([data(k, (k + 1, 2), dt) for k in range(n)])), dt
    got = hvd.grouped_allgather([ragged, mine], name=f"gag.{dt}")
    assert same(got[1], torch.cat(every)), dt

    for root in range(n):
        assert same(hvd.broadcast(mine, root_rank=root, name=f"bc.{dt}.{root}"), every[root]), (dt, root)
    t = mine.clone()
    hvd.broadcast_(t, root_rank=n - 1, name=f"bc_.{dt}")
    assert same(t, every[-1]), dt

    out = hvd.alltoall(mine, name=f"a2a.{dt}")
    rows = mine.shape[0] // n
    assert same(out, torch.cat([e[r * rows:(r + 1) * rows] for e in every])), dt

    got = hvd.reducescatter(mine, op=hvd.Sum, name=f"rs.{dt}")
    ref = wide.sum(0) if dt != torch.bool else wide.amax(0)
    assert got.dtype == dt and torch.equal(got.to(torch.float64), ref[r * rows:(r + 1) * rows]), dt

hvd.barrier()
hvd.shutdown()
print(f"rank {r}: dtypes ok")
