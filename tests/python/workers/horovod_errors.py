"""Every error chorus.torch raises where Horovod's tests expect a type, checked
against that type (Horovod's torch frontend: an InvalidArgument status is a
ValueError, a refused or failed collective a RuntimeError, HorovodInternalError);
after each, the ranks agree again and the next collective works. Run on 2 ranks."""
import torch

import chorus.torch as hvd

try:
    hvd.size()
    raise SystemExit("size() before init")
except ValueError as e:
    assert "init" in str(e), e

hvd.init(process_sets=[hvd.ProcessSet([0])])
r, n = hvd.rank(), hvd.size()
only0 = hvd.ProcessSet([0])
only0.process_set_id = 1
fake = hvd.ProcessSet([0])
fake.process_set_id = 7


def duplicate_name():
    """Rank 0 submits "dup" twice while it is surely in flight: rank 1 submits its "dup" only after
    rank 0's second try (an op of another name, which completes while "dup" waits, says when)."""
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), name="dup")
        try:
            hvd.allreduce_async(torch.ones(2), name="dup")
        finally:
            hvd.allreduce(torch.ones(1), name="dup.tried")
            hvd.synchronize(h)
    else:
        hvd.allreduce(torch.ones(1), name="dup.tried")
        hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="dup"))
        raise ValueError("dup: rank 0 checks the name twice in flight")


def optimizer(named):
    model = torch.nn.Linear(2, 1)
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model))


def join_then_allgather():  # rank 0 joins; rank 1's allgather is refused
    if r == 0:
        hvd.join()
        hvd.barrier()
        raise RuntimeError("joined")
    try:
        hvd.allgather(torch.ones(1), name="refused.gather")  # named: only this rank calls it
    finally:
        hvd.join()
        hvd.barrier()


fp = torch.float64 if r else torch.float32
# (situation, call, the type Horovod raises, a part of the message)
CASES = [
    ("allreduce shapes differ", lambda: hvd.allreduce(torch.ones(2 + r)), RuntimeError, "shape"),
    ("allreduce dtypes differ", lambda: hvd.allreduce(torch.ones(2, dtype=fp)), RuntimeError, "float64"),
    ("grouped allreduce shapes differ", lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(1 + r)]),
     RuntimeError, "shape"),
    ("a name twice in flight", duplicate_name, ValueError, "dup"),
    ("allgather trailing dims differ", lambda: hvd.allgather(torch.ones(2, 2 + r)), RuntimeError, "shape"),
    ("allgather dtypes differ", lambda: hvd.allgather(torch.ones(2, dtype=fp)), RuntimeError, "float64"),
    ("broadcast shapes differ", lambda: hvd.broadcast(torch.ones(2 + r), 0), RuntimeError, "shape"),
    ("broadcast dtypes differ", lambda: hvd.broadcast(torch.ones(2, dtype=fp), 0), RuntimeError, "float64"),
    ("broadcast roots differ", lambda: hvd.broadcast(torch.ones(2), r), RuntimeError, "root"),
    ("broadcast root outside the set", lambda: hvd.broadcast(torch.ones(2), n), ValueError, "root"),  # as torch
    ("alltoall dtypes differ", lambda: hvd.alltoall(torch.ones(2, dtype=fp)), RuntimeError, "float64"),
    ("alltoall trailing dims differ", lambda: hvd.alltoall(torch.ones(2, 1 + r)), RuntimeError, "shape"),
    ("alltoall splits of the wrong length", lambda: hvd.alltoall(torch.ones(4), torch.tensor([4])), ValueError,
     "splits"),
    ("alltoall splits over the first dim", lambda: hvd.alltoall(torch.ones(4), torch.tensor([3, 3])), ValueError,
     "splits"),
    ("alltoall splits not integers", lambda: hvd.alltoall(torch.ones(4), torch.tensor([2.0, 2.0])), ValueError,
     "splits"),
    ("reducescatter with Min", lambda: hvd.reducescatter(torch.ones(4), op=hvd.Min), NotImplementedError, "Sum"),
    ("a process set id nobody registered", lambda: hvd.allreduce(torch.ones(2), process_set=fake), ValueError,
     "7"),
    ("a process set this rank is not in", lambda: hvd.allreduce(torch.ones(2), process_set=only0)
     if r == 1 else (_ for _ in ()).throw(ValueError("not a member (rank 0 expects the error on rank 1)")),
     ValueError, "member"),
    ("named_parameters with a name twice", lambda: optimizer(lambda m: [("w", p) for p in m.parameters()]),
     ValueError, "w"),
    ("named_parameters missing a parameter", lambda: optimizer(lambda m: list(m.named_parameters())[:1]),
     ValueError, "named_parameters"),
    ("allgather beside a joined rank", join_then_allgather, RuntimeError, "join"),
]

for what, call, want, words in CASES:
    print(f"rank {r}: {what}", flush=True)
    try:
        call()
        raise SystemExit(f"rank {r}: {what}: no error")
    except Exception as e:  # noqa: BLE001 (the type is what is checked)
        if not isinstance(e, want) or words.lower() not in str(e).lower():
            raise SystemExit(f"rank {r}: {what}: {type(e).__mro__} {e!r}; Horovod raises {want.__name__}")
        if want is RuntimeError and "joined" not in str(e):
            assert isinstance(e, hvd.HorovodInternalError), (what, type(e))
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after {what}")
    assert got.tolist() == [float(n)] * 2, (what, got)
print(f"horovod errors ok rank {r}", flush=True)
hvd.shutdown()
