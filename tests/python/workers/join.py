"""join as Horovod defines it: ranks run out of data at different steps and join while
the others still run collectives (a joined rank gives zeros to reductions and no rows
to alltoalls; allgather and broadcast are refused while a rank has joined, as
Horovod refuses them); the runtime is usable afterwards."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
for step in range(r + 1):  # rank r has r + 1 batches
    active = n - step  # ranks step..n-1 are still here
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"step{step}")
    assert got.tolist() == [float(active)] * 3, (step, got)
    avg = hvd.allreduce(torch.ones(2), name=f"avg{step}")  # Average divides by every rank
    assert torch.allclose(avg, torch.full((2,), active / n)), (step, avg)
    if step == 0:  # nobody has joined yet
        rows = hvd.allgather(torch.full((2, 1), r, dtype=torch.int16), name=f"gather{step}")
        assert rows.flatten().tolist() == [k for k in range(n) for _ in range(2)], (step, rows)
        b = hvd.broadcast(torch.tensor([float(r)]), root_rank=n - 1, name=f"bcast{step}")
        assert b.item() == n - 1
    else:
        for what, call in (("Allgather", lambda: hvd.allgather(torch.ones(2, 1), name=f"gather{step}")),
                           ("Broadcast", lambda: hvd.broadcast(torch.ones(1), root_rank=n - 1, name=f"bcast{step}"))):
            try:
                call()
                raise AssertionError(f"{what} ran while a rank had joined")
            except AssertionError:
                raise
            except hvd.HorovodInternalError as e:  # a RuntimeError, as Horovod raises
                assert isinstance(e, RuntimeError) and not isinstance(e, ValueError), type(e).__mro__
                assert f"{what} is not supported with Join" in str(e), e
    out = hvd.alltoall(torch.arange(n) + 10 * r, name=f"a2a{step}")
    assert out.tolist() == [10 * k + r for k in range(step, n)], (step, out)
    rs = hvd.reducescatter(torch.ones(2 * n), op=hvd.Sum, name=f"rs{step}")
    assert rs.tolist() == [float(active)] * 2, (step, rs)
assert hvd.join() == n - 1

# Afterwards every rank runs again, on every op, and can join again.
assert hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="after").item() == sum(range(n))
assert hvd.allgather(torch.tensor([r]), name="after.gather").tolist() == list(range(n))
assert hvd.broadcast(torch.tensor([r]), root_rank=0, name="after.bcast").item() == 0
hvd.barrier()
assert hvd.join() in range(n)
assert hvd.is_initialized()
hvd.shutdown()
print(f"rank {r}: join ok")
