"""Ranks on different code paths inside a tf.function. TensorFlow's graph
executor gives no sign that a rank is idle (its ops are asynchronous), so the
blocked-ranks breaker cannot tell a diverged rank from a slow one; as in Horovod,
CHORUS_STALL_SHUTDOWN_TIME_SECONDS ends the job: every rank's op fails with an
error naming the stalled op and the ranks missing it, never a hang. Run on 2 ranks."""
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r = hvd.rank()


@tf.function
def step(x):
    return hvd.allreduce(x, name=f"graph.only.on.rank{r}")  # a name the other rank never uses


try:
    step(tf.ones([3]))
    raise SystemExit("the diverged op completed")
except tf.errors.OpError as e:
    assert "CHORUS_STALL_SHUTDOWN_TIME_SECONDS" in e.message, e.message
    assert "graph.only.on.rank" in e.message, e.message
print(f"tf graph diverged stopped rank {r}", flush=True)
