"""broadcast_ in a TF1 graph: fetching what it returns assigns root's values in
place, as Horovod's does (and in a tf.function too)."""
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
root = n - 1
g = tf.Graph()
with g.as_default():
    v = tf.compat.v1.Variable([float(r) + 1, 2.0 * (r + 1)])
    out = hvd.broadcast_([v], root_rank=root)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        got = s.run(out)
        after = s.run(v)
want = [float(root) + 1, 2.0 * (root + 1)]
assert got[0].tolist() == want and after.tolist() == want, (got, after)
w = tf.Variable(float(r) * 10)


@tf.function
def f():
    return hvd.broadcast_([w], root_rank=root)


f()
assert float(w.numpy()) == root * 10.0, w.numpy()
print(f"tf graph broadcast ok rank {r}", flush=True)
