"""Duplicate process sets are refused at init and at add_process_set, as Horovod refuses them."""
import chorus.torch as hvd

try:
    hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 0])])
    raise SystemExit("init took the same process set twice")
except ValueError as e:
    assert "given twice" in str(e), e
assert not hvd.is_initialized()
hvd.init(process_sets="dynamic")
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
