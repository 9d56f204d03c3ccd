"""Errors of the types Horovod raises, in TensorFlow: IndexedSlices with another op
than Sum and Average, or with pre/postscale, and reducescatter with another op are
NotImplementedError; a process set id nobody registered is a ValueError."""
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 2]), dense_shape=tf.constant([4, 3]))
for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
    try:
        hvd.allreduce(slices, op=op)
        raise SystemExit(f"IndexedSlices took {op}")
    except NotImplementedError:
        pass
    if op is not hvd.Adasum:
        try:
            hvd.reducescatter(tf.ones([4]), op=op)
            raise SystemExit(f"reducescatter took {op}")
        except NotImplementedError:
            pass
try:
    hvd.allreduce(slices, op=hvd.Sum, prescale_factor=2.0)
    raise SystemExit("IndexedSlices took a prescale factor")
except NotImplementedError as e:
    assert "Pre/postscale" in str(e), e
bad = hvd.ProcessSet([0])
bad.process_set_id = 7
try:
    hvd.allreduce(tf.ones([2]), process_set=bad)
    raise SystemExit("an unregistered process set id was accepted")
except ValueError as e:
    assert "not a registered process set" in str(e), e
got = hvd.allreduce(slices, op=hvd.Sum)
assert got.values.shape[0] == 2 * hvd.size()
print(f"tf horovod errors ok rank {hvd.rank()}", flush=True)
