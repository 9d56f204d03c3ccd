"""Failures as tf.errors carrying chorus's message: ranks that disagree (eagerly
and in a graph), then a rank that dies while the others wait in an op."""
import os
import signal

import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
t = tf.ones(4, dtype=tf.float64 if r == 1 else tf.float32)
try:
    hvd.allreduce(t, name="layer3.weight.grad")
    raise SystemExit("no mismatch error")
except tf.errors.FailedPreconditionError as e:
    assert "layer3.weight.grad" in e.message and "float64 on ranks [1]" in e.message, e.message


@tf.function
def shapes(x):
    return hvd.allgather(x, name="gathered") if r != 0 else hvd.allreduce(x, name="gathered")


try:
    shapes(tf.ones(3))
    raise SystemExit("no mismatch error in a graph")
except tf.errors.FailedPreconditionError as e:
    assert "gathered" in e.message, e.message
# The runtime goes on.
assert hvd.allreduce(tf.ones(2), op=hvd.Sum).numpy().tolist() == [float(n)] * 2
try:
    hvd.allreduce(tf.ones(2), process_set=hvd.ProcessSet([0]))
    raise SystemExit("unregistered set accepted")
except ValueError:
    pass

try:
    for step in range(10000):
        if r == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(tf.ones(1000), name="grad")
    raise SystemExit("no failure seen")
except tf.errors.UnknownError as e:
    print(f"rank {r}: UnknownError caught: {e.message}", flush=True)
