"""A mismatch is an error on every rank naming the tensor, and the runtime goes on."""
import torch

import chorus.torch as hvd

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
r = hvd.rank()
t = torch.ones(4, dtype=torch.float64 if r == 1 else torch.float32)
try:
    hvd.allreduce(t, name="layer3.weight.grad")
    raise SystemExit("no mismatch error")
except hvd.HorovodInternalError as e:
    msg = str(e)
    assert isinstance(e, hvd.MismatchError)
    assert "layer3.weight.grad" in msg and "float64 on ranks [1]" in msg, msg
assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [3.0, 3.0]
# The same name on another process set on rank 1: an error on every rank.
try:
    hvd.allreduce(torch.ones(3), name="shared.name", process_set=pair if r == 1 else hvd.global_process_set)
    raise SystemExit("no error for a name used on two process sets")
except hvd.MismatchError as e:
    assert "shared.name" in str(e) and "process set" in str(e), str(e)
assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.sets").tolist() == [3.0, 3.0]
try:
    hvd.ProcessSet([0, 2]).included()
    raise SystemExit("unregistered set accepted")
except ValueError:
    pass
hvd.shutdown()
print(f"rank {r}: mismatch ok")
