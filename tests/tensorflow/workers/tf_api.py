"""Horovod's TensorFlow API pieces that real code calls: broadcast_global_variables
(refused eagerly, as Horovod), keras allreduce giving a tensor, ProcessSet.mpi_comm,
DistributedGradientTape.register_local_source, a tape on a rank outside its set."""
import tensorflow as tf

import chorus.tensorflow as hvd
import chorus.tensorflow.keras as hvdk

ps = hvd.ProcessSet([0])
hvd.init(process_sets=[ps])
r, n = hvd.rank(), hvd.size()
try:
    hvd.broadcast_global_variables(0)
    raise SystemExit("broadcast_global_variables ran eagerly")
except RuntimeError as e:
    assert "eager" in str(e), e
assert isinstance(hvdk.allreduce(1.0 + r, op=hvd.Sum), tf.Tensor)
assert ps.mpi_comm is None and hvd.ProcessSet([0, 1]).mpi_comm is None

a = tf.Variable([1.0, 2.0])
b = tf.Variable([3.0])
with tf.GradientTape() as t:
    loss = tf.reduce_sum(a * float(r + 1)) + tf.reduce_sum(b * float(r + 1))
tape = hvd.DistributedGradientTape(t)
tape.register_local_source(b)
ga, gb = tape.gradient(loss, [a, b])
mean = sum(k + 1 for k in range(n)) / n
assert ga.numpy().tolist() == [mean, mean], ga  # averaged over the ranks
assert gb.numpy().tolist() == [(r + 1) / n], gb  # this rank's own, scaled as the averaged ones

# A rank outside the tape's process set gets its own gradients back, untouched.
with tf.GradientTape() as t:
    loss = tf.reduce_sum(a * float(r + 1))
g = hvd.DistributedGradientTape(t, process_set=ps).gradient(loss, [a])[0]
assert g.numpy().tolist() == [float(r + 1)] * 2, g
print(f"tf api ok rank {r}", flush=True)

# PartialDistributedOptimizer: the local layer trains on this rank's gradient alone.
import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(0)
shared_layer, local_layer = keras.layers.Dense(2, use_bias=False), keras.layers.Dense(1, use_bias=False)
model = keras.Sequential([keras.Input((3,)), shared_layer, local_layer])
start = [w.copy() for w in model.get_weights()]
opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local_layer])
x = np.full((1, 3), float(r + 1), np.float32)
with tf.GradientTape() as t:
    loss = tf.reduce_sum(model(x))
grads = t.gradient(loss, model.trainable_variables)
opt.apply(grads, model.trainable_variables)
moved = [s - w for s, w in zip(start, model.get_weights())]
all_moves = hvd.allgather_object([m.tolist() for m in moved])
assert all(np.allclose(m[0], all_moves[0][0]) for m in all_moves), "the shared layer moved differently"
assert np.allclose(moved[1], grads[1].numpy() / n), (moved[1], grads[1].numpy())  # local, scaled by 1/n
print(f"tf partial ok rank {r}", flush=True)

# A collective is never run while TensorFlow builds a graph: SplitV's shape
# inference asks for the value of its sizes, which here come from an allgather
# of a constant; folding it would run the allgather on one rank at build time.
from chorus import _core  # noqa: E402

before = _core.process_set_stats(0)["negotiated_ops"] + _core.process_set_stats(0)["cached_ops"]
graph = tf.Graph()
with graph.as_default():
    sizes = hvd.allgather(tf.constant([2 + r]), name="split.sizes")
    parts = tf.split(tf.ones([sum(2 + k for k in range(n))]), sizes, num=n)
after = _core.process_set_stats(0)["negotiated_ops"] + _core.process_set_stats(0)["cached_ops"]
assert after == before, f"building the graph ran {after - before} collective(s)"
with tf.compat.v1.Session(graph=graph) as sess:
    got = sess.run(parts[r])
assert got.shape == (2 + r,), got.shape
print(f"tf graph build ok rank {r}", flush=True)
