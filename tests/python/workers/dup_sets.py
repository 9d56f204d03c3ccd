"""Duplicate process sets are refused at init and at add_process_set, as Horovod
refuses them: init registers the sets and raises a ValueError on a rank that sees
one twice (or the global set); the runtime is up, and init() again with other
sets registers those instead. Run on 3 ranks."""
import chorus.torch as hvd

for sets, why in (([[0, 1], [1, 0]], "given twice"), ([[0], [2, 1, 0]], "is the global set")):
    try:
        hvd.init(process_sets=[hvd.ProcessSet(s) for s in sets])
        raise SystemExit(f"init took {sets}")
    except ValueError as e:
        assert why in str(e), e
    assert hvd.is_initialized() and hvd.size() == 3  # up, as Horovod's is after that error
low, high = hvd.ProcessSet([0]), hvd.ProcessSet([2, 1])
hvd.init(process_sets=[low, high])
assert (low.process_set_id, high.process_set_id, high.ranks) == (1, 2, [1, 2]), (low, high)
assert sorted(hvd.mpi_ops._basics._get_process_set_ids_and_ranks().items()) == [(0, [0, 1, 2]), (1, [0]),
                                                                               (2, [1, 2])]
import torch  # noqa: E402
got = hvd.allreduce(torch.tensor([1.0 + hvd.rank()]), op=hvd.Sum, process_set=high) if high.included() else None
assert got is None or got.item() == 5.0, got  # ranks 1 and 2: 2 + 3
hvd.init(process_sets="dynamic")  # dynamic now: the static sets give way
assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {0: [0, 1, 2]}
assert low.process_set_id is None
n = hvd.size()
for ranks in (list(range(n)), [0]):
    if ranks == [0]:
        first = hvd.add_process_set([0])
    try:
        hvd.add_process_set(ranks)
        raise SystemExit(f"add_process_set took {ranks} a second time")
    except ValueError as e:
        assert "exists already" in str(e), e
hvd.remove_process_set(first)
again = hvd.add_process_set([0])  # once removed, it can come back
print(f"dup sets ok rank {hvd.rank()}", flush=True)
hvd.shutdown()
