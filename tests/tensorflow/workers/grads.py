"""Gradients of every op against Horovod's definitions, computed here in NumPy
from every rank's upstream weights: eagerly and in tf.function."""
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()


def weights(rank, shape):
    return np.random.default_rng(5 + rank).normal(size=shape)


def grad_of(mode, f, x):
    def g(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return tape.gradient(y, x)
    return (tf.function(g, autograph=False) if mode == "graph" else g)(x).numpy()


def close(a, b, what):
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-9), (what, a, b)


for mode in ("eager", "graph"):
    x = tf.constant(np.arange(6.0).reshape(3, 2) + r)
    W = [weights(k, (3, 2)) for k in range(n)]
    for op, ref in [(hvd.Sum, sum(W)), (hvd.Average, sum(W) / n)]:
        got = grad_of(mode, lambda x: tf.reduce_sum(W[r] * hvd.allreduce(x, op=op, prescale_factor=0.5,
                                                                         postscale_factor=3.0)), x)
        close(got, ref * 1.5, f"{mode} allreduce {op}")
        got = grad_of(mode, lambda x: tf.reduce_sum(W[r] * hvd.grouped_allreduce([x, 2 * x], op=op)[1]), x)
        close(got, ref * 2, f"{mode} grouped allreduce {op}")

    # allgather: the gathered gradient averaged over ranks, this rank's rows of it.
    rows = [k + 1 for k in range(n)]
    xg = tf.constant(np.ones((rows[r], 2)) * r)
    WG = [weights(k, (sum(rows), 2)) for k in range(n)]
    got = grad_of(mode, lambda x: tf.reduce_sum(WG[r] * hvd.allgather(x)), xg)
    start = sum(rows[:r])
    close(got, (sum(WG) / n)[start:start + rows[r]], f"{mode} allgather")
    got = grad_of(mode, lambda x: tf.reduce_sum(WG[r] * hvd.grouped_allgather([x])[0]), xg)
    close(got, (sum(WG) / n)[start:start + rows[r]], f"{mode} grouped allgather")

    # broadcast: the averaged gradient on the root, zeros elsewhere.
    root = n - 1
    got = grad_of(mode, lambda x: tf.reduce_sum(W[r] * hvd.broadcast(x, root)), x)
    close(got, sum(W) / n if r == root else np.zeros((3, 2)), f"{mode} broadcast")

    # alltoall: the gradient travels back (rank k sent k+1 rows to each rank).
    xa = tf.constant(np.ones(((r + 1) * n, 2)))
    WA = [weights(10 + k, (sum(rows), 2)) for k in range(n)]  # rank k received rows[j] from each j
    got = grad_of(mode, lambda x: tf.reduce_sum(WA[r] * hvd.alltoall(x, splits=[r + 1] * n)[0]), xa)
    # Row block i of my input went to rank i, where it sat at offset sum(rows[:r]).
    ref = np.concatenate([WA[i][sum(rows[:r]):sum(rows[:r]) + rows[r]] for i in range(n)])
    close(got, ref, f"{mode} alltoall")

    # reducescatter: a sum's gradient is scaled by the size, then gathered.
    xr = tf.constant(np.ones((2 * n, 2)) * r)
    WR = [weights(20 + k, (2, 2)) for k in range(n)]
    for op, scale in [(hvd.Sum, n), (hvd.Average, 1)]:
        got = grad_of(mode, lambda x: tf.reduce_sum(WR[r] * hvd.reducescatter(x, op=op)), xr)
        close(got, np.concatenate(WR) * scale, f"{mode} reducescatter {op}")
        got = grad_of(mode, lambda x: tf.reduce_sum(WR[r] * hvd.grouped_reducescatter([x], op=op)[0]), xr)
        close(got, np.concatenate(WR) * scale, f"{mode} grouped reducescatter {op}")

hvd.shutdown()
print(f"rank {r}: tf grads ok")
