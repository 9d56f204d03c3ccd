"""Ranks on different code paths in eager TensorFlow (a test that failed on one
rank and went on): once every rank has waited CHORUS_BLOCKED_FAIL_SECONDS on ops
that the others never submitted, those ops fail on every rank, naming them, and
the runtime goes on. Run on 2 ranks."""
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
try:
    hvd.allreduce(tf.ones([3]), name=f"only.on.rank{r}")  # each rank a name the other never uses
    raise SystemExit("the diverged op completed")
except tf.errors.OpError as e:
    assert f"only.on.rank{r}" in e.message and "CHORUS_BLOCKED_FAIL_SECONDS" in e.message, e.message
got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after")
assert got.numpy().tolist() == [float(n)] * 2, got
print(f"tf diverged ok rank {r}", flush=True)
