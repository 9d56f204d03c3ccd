"""Process sets added and removed at run time, with ops and gradients on them."""
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init(process_sets="dynamic")
r, n = hvd.rank(), hvd.size()
evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
odds = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
mine = evens if r % 2 == 0 else odds
members = mine.ranks


@tf.function
def gathered_grad(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(hvd.allgather(x, process_set=mine) * float(r + 1))
    return tape.gradient(y, x)


x = tf.fill([2], float(r))
got = hvd.allreduce(x, op=hvd.Sum, process_set=mine).numpy()
assert np.allclose(got, sum(members)), got
# allgather's gradient: the set's average of the upstream weights (r + 1).
assert np.allclose(gathered_grad(x).numpy(), np.mean([k + 1 for k in members])), gathered_grad(x)
assert int(hvd.size_op(process_set_id=mine.process_set_id)) == len(members)
assert hvd.broadcast_object(r, root_rank=members[-1], process_set=mine) == members[-1]
assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)
assert hvd.remove_process_set(hvd.global_process_set) is False  # the global set stays, as Horovod's
assert repr(hvd.global_process_set) == f"ProcessSet(process_set_id=0, ranks={list(range(n))}, mpi_comm=None)"
try:
    hvd.allreduce(x, process_set=evens)
    raise SystemExit("a removed set was accepted")
except ValueError:
    pass
assert hvd.allreduce(x, op=hvd.Sum).numpy().tolist() == [float(sum(range(n)))] * 2
hvd.shutdown()
print(f"rank {r}: tf dynamic sets ok")
