"""Every op of chorus.tensorflow, eagerly and in tf.function, every dtype
TensorFlow has that chorus carries, against NumPy values computed here."""
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
subset = hvd.ProcessSet([0, 2]) if n >= 3 else None
if subset is not None:
    hvd.shutdown()
    hvd.init(process_sets=[subset])

DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64, tf.bool]


def data(rank, shape, dt):
    g = np.random.default_rng(77 + rank)
    a = g.integers(0, 2, shape) if dt == tf.bool else g.integers(0, 9, shape)
    return a


def tensor(a, dt):
    return tf.cast(tf.constant(a), dt)


def check(got, ref, dt, what, exact=True):
    got = tf.cast(got, tf.float64).numpy() if dt != tf.bool else tf.cast(got, tf.int64).numpy()
    tol = {tf.float16: 1e-2, tf.bfloat16: 5e-2}.get(dt, 1e-6)
    same = np.array_equal(got, ref) if exact else np.allclose(got, ref, rtol=tol, atol=tol)
    assert got.shape == np.shape(ref) and same, (what, dt, got, ref)


def run(mode, fn, *args):
    return (tf.function(fn, autograph=False) if mode == "graph" else fn)(*args)


for mode in ("eager", "graph"):
    for dt in DTYPES:
        every = [data(k, (4 * n, 3), dt) for k in range(n)]
        mine = tensor(every[r], dt)
        wide = np.stack(every).astype(np.float64)
        sum_ref = wide.sum(0) if dt != tf.bool else wide.max(0)  # a sum of bools is "any"
        for op, ref in [(hvd.Sum, sum_ref), (hvd.Min, wide.min(0)), (hvd.Max, wide.max(0))]:
            got = run(mode, lambda x: hvd.allreduce(x, op=op), mine)
            assert got.dtype == dt
            check(got, ref, dt, f"{mode} allreduce {op}")
        if dt.is_floating:
            check(run(mode, lambda x: hvd.allreduce(x), mine), wide.mean(0), dt, "average", exact=False)
            got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0), mine)
            check(got, wide.sum(0) * 2, dt, "scaled", exact=False)
        got = run(mode, lambda x: hvd.grouped_allreduce([x, x[:1]], op=hvd.Max), mine)
        check(got[0], wide.max(0), dt, "grouped 0")
        check(got[1], wide.max(0)[:1], dt, "grouped 1")

        ragged = tensor(data(r, (r + 1, 2), dt), dt)
        got = run(mode, hvd.allgather, ragged)
        check(got, np.concatenate([data(k, (k + 1, 2), dt) for k in range(n)]), dt, "allgather")
        got = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), ragged, mine)
        check(got[1], np.concatenate(every), dt, "grouped allgather")
        scalars = np.array([k if dt != tf.bool else int(k > 0) for k in range(n)])
        check(run(mode, lambda: hvd.allgather(tf.cast(tf.constant(r), dt))), scalars, dt, "allgather of scalars")

        for root in range(n):
            check(run(mode, lambda x: hvd.broadcast(x, root), mine), every[root], dt, f"broadcast {root}")

        rows = 4
        got = run(mode, hvd.alltoall, mine)
        check(got, np.concatenate([e[r * rows:(r + 1) * rows] for e in every]), dt, "alltoall")
        # Uneven: rank k sends k+1 rows to each rank.
        uneven = tensor(data(r, ((r + 1) * n, 2), dt), dt)
        got, received = run(mode, lambda x: hvd.alltoall(x, splits=[r + 1] * n), uneven)
        check(got, np.concatenate([data(k, ((k + 1) * n, 2), dt)[r * (k + 1):(r + 1) * (k + 1)] for k in range(n)]),
              dt, "alltoall splits")
        assert received.numpy().tolist() == [k + 1 for k in range(n)]

        got = run(mode, lambda x: hvd.reducescatter(x, op=hvd.Sum), mine)
        check(got, sum_ref[r * rows:(r + 1) * rows], dt, "reducescatter")
        got = run(mode, lambda x: hvd.grouped_reducescatter([x, x[:2 * n]], op=hvd.Sum), mine)
        check(got[1], sum_ref[:2 * n][r * 2:(r + 1) * 2], dt, "grouped reducescatter")

    if subset is not None and subset.included():
        members = [0, 2]
        me = tensor(data(r, (2, 3), tf.float32), tf.float32)
        ref = np.stack([data(k, (2, 3), tf.float32) for k in members]).astype(np.float64)
        check(run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, process_set=subset), me), ref.sum(0), tf.float32,
              "set allreduce")
        check(run(mode, lambda x: hvd.allgather(x, process_set=subset), me), np.concatenate(ref), tf.float32,
              "set allgather")
        check(run(mode, lambda x: hvd.broadcast(x, 2, process_set=subset), me), ref[1], tf.float32, "set bcast")
        check(run(mode, lambda x: hvd.reducescatter(x, op=hvd.Sum, process_set=subset), me),
              ref.sum(0)[subset.rank():subset.rank() + 1], tf.float32, "set reducescatter")
        assert int(hvd.size_op(process_set_id=subset.process_set_id)) == 2
        assert int(hvd.process_set_included_op(process_set_id=subset.process_set_id)) == 1
    hvd.barrier()

# Variables go in as their values; broadcast_ writes them in place.
v = tf.Variable(tf.fill([3], float(r)))
assert hvd.allreduce(v, op=hvd.Sum).numpy().tolist() == [float(sum(range(n)))] * 3
hvd.broadcast_([v], root_rank=n - 1)
assert v.numpy().tolist() == [float(n - 1)] * 3
w = [tf.Variable(tf.fill([2], float(r))), tf.Variable(tf.fill([4], float(r) * 2))]
hvd.broadcast_variables(w, root_rank=0)
assert w[0].numpy().tolist() == [0.0] * 2 and w[1].numpy().tolist() == [0.0] * 4

# IndexedSlices are gathered (averaged values), sparse_as_dense is left to the optimizers.
sl = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]), dense_shape=tf.constant([n, 2]))
got = hvd.allreduce(sl, op=hvd.Average)
assert got.indices.numpy().tolist() == list(range(n))
assert np.allclose(got.values.numpy()[:, 0], [(k + 1) / n for k in range(n)])

# Objects, rank queries, fp16 compression.
assert hvd.broadcast_object({"from": r}, root_rank=n - 1) == {"from": n - 1}
assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
assert int(hvd.rank_op()) == r and int(hvd.size_op()) == n and int(hvd.local_size_op()) == hvd.local_size()
got = hvd.allreduce(tf.constant([1.0, 2.5], tf.float32) * (r + 1), op=hvd.Sum, compression=hvd.Compression.fp16)
assert got.dtype == tf.float32 and np.allclose(got.numpy(), np.array([1.0, 2.5]) * n * (n + 1) / 2)
assert int(hvd.join()) in range(n)
hvd.shutdown()
print(f"rank {r}: tf ops ok")
