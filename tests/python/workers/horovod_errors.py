"""Errors of the types Horovod raises: reducescatter with another op than Sum and
Average (NotImplementedError, a RuntimeError), a process set id nobody registered
(ValueError); the runtime goes on after each."""
import torch

import chorus.torch as hvd

hvd.init()
for op in (hvd.Adasum, hvd.Min, hvd.Max, hvd.Product):
    for call in (lambda: hvd.reducescatter(torch.ones(4), op=op),
                 lambda: hvd.grouped_reducescatter([torch.ones(4)], op=op)):
        try:
            call()
            raise SystemExit(f"reducescatter took {op}")
        except NotImplementedError as e:
            assert isinstance(e, RuntimeError) and "Sum and op=Average" in str(e), e
bad = hvd.ProcessSet([0])
bad.process_set_id = 7
try:
    hvd.allreduce(torch.ones(2), process_set=bad)
    raise SystemExit("an unregistered process set id was accepted")
except ValueError as e:
    assert "7 is not a registered process set" in str(e), e
assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [float(hvd.size())] * 2
print(f"horovod errors ok rank {hvd.rank()}", flush=True)
hvd.shutdown()
