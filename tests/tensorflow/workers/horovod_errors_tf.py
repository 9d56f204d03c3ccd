"""Every error chorus.tensorflow raises where Horovod's tests expect a type, checked
against that type: ranks that disagree are tf.errors.FailedPreconditionError, bad
alltoall splits tf.errors.InvalidArgumentError, a set this rank is not in
InvalidArgumentError, an id nobody registered ValueError, IndexedSlices or
reducescatter with another op than Sum/Average NotImplementedError. After each,
the ranks agree again and the next collective works. Run on 2 ranks."""
import tensorflow as tf

import chorus.tensorflow as hvd

try:
    hvd.size()
    raise SystemExit("size() before init")
except ValueError as e:
    assert "init" in str(e), e
hvd.init(process_sets=[hvd.ProcessSet([0])])
r, n = hvd.rank(), hvd.size()
only0 = hvd.ProcessSet([0])
only0.process_set_id = 1
fake = hvd.ProcessSet([0])
fake.process_set_id = 7
slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 2]), dense_shape=tf.constant([4, 3]))
fp = tf.float64 if r else tf.float32
FPE, IAE = tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError


def in_graph(fn):
    return lambda: tf.function(fn)()


def join_then_allgather():  # rank 0 joins; rank 1's allgather is refused
    if r == 0:
        hvd.join()
        hvd.barrier()
        raise FPE(None, None, "joined")
    try:
        hvd.allgather(tf.ones([1]), name="refused.gather")  # named: only this rank calls it
    finally:
        hvd.join()
        hvd.barrier()


# (situation, call, the type Horovod raises, a part of the message)
CASES = [
    ("allreduce shapes differ", lambda: hvd.allreduce(tf.ones([2 + r])), FPE, "shape"),
    ("allreduce dtypes differ", lambda: hvd.allreduce(tf.ones([2], dtype=fp)), FPE, "float64"),
    ("allreduce shapes differ in a graph", in_graph(lambda: hvd.allreduce(tf.ones([2 + r]))), FPE, "shape"),
    ("allgather trailing dims differ", lambda: hvd.allgather(tf.ones([2, 2 + r])), FPE, "shape"),
    ("allgather dtypes differ", lambda: hvd.allgather(tf.ones([2], dtype=fp)), FPE, "float64"),
    ("broadcast shapes differ", lambda: hvd.broadcast(tf.ones([2 + r]), 0), FPE, "shape"),
    ("broadcast dtypes differ", lambda: hvd.broadcast(tf.ones([2], dtype=fp), 0), FPE, "float64"),
    ("broadcast roots differ", lambda: hvd.broadcast(tf.ones([2]), r), FPE, "root"),
    ("alltoall dtypes differ", lambda: hvd.alltoall(tf.ones([2], dtype=fp)), FPE, "float64"),
    ("alltoall trailing dims differ", lambda: hvd.alltoall(tf.ones([2, 1 + r])), FPE, "shape"),
    ("alltoall splits of the wrong length", lambda: hvd.alltoall(tf.ones([4]), splits=[4]), IAE, "splits"),
    ("alltoall splits over the first dim", lambda: hvd.alltoall(tf.ones([4]), splits=[3, 3]), IAE, "splits"),
    ("a process set this rank is not in", lambda: hvd.allreduce(tf.ones([2]), process_set=only0)
     if r == 1 else (_ for _ in ()).throw(IAE(None, None, "not a member (the error is rank 1's)")), IAE, "member"),
    ("a process set id nobody registered", lambda: hvd.allreduce(tf.ones([2]), process_set=fake), ValueError, "7"),
    ("IndexedSlices with Min", lambda: hvd.allreduce(slices, op=hvd.Min), NotImplementedError, "Sum"),
    ("IndexedSlices with a prescale factor", lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=2.0),
     NotImplementedError, "Pre/postscale"),
    ("reducescatter with Max", lambda: hvd.reducescatter(tf.ones([4]), op=hvd.Max), NotImplementedError, "Sum"),
    ("broadcast_global_variables eagerly", lambda: hvd.broadcast_global_variables(0), RuntimeError, "eager"),
    ("allgather beside a joined rank", join_then_allgather, FPE, "join"),
]

for what, call, want, words in CASES:
    print(f"rank {r}: {what}", flush=True)
    try:
        call()
        raise SystemExit(f"rank {r}: {what}: no error")
    except Exception as e:  # noqa: BLE001 (the type is what is checked)
        text = e.message if isinstance(e, tf.errors.OpError) else str(e)
        if not isinstance(e, want) or words.lower() not in text.lower():
            raise SystemExit(f"rank {r}: {what}: {type(e).__name__} {text!r}; Horovod raises {want.__name__}")
    got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=f"after.{len(what)}.{what.replace(' ', '_')}")
    assert got.numpy().tolist() == [float(n)] * 2, (what, got)
got = hvd.allreduce(slices, op=hvd.Sum)
assert got.values.shape[0] == 2 * n
print(f"tf horovod errors ok rank {r}", flush=True)
