"""horovod.tensorflow's public collectives over the ops in mpi_ops: compression,
IndexedSlices, variables and Python objects."""
import tensorflow as tf

from chorus.common import objects
from chorus.common.process_sets import _set_id, global_process_set
from chorus.tensorflow import mpi_ops
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.mpi_ops import Adasum, Average, Sum, _reduce_op


def _sparse_allreduce(tensor, op, name, process_set, ignore_name_scope, prescale_factor=1.0, postscale_factor=1.0):
    """IndexedSlices: every rank's rows gathered (duplicates add up when applied).
    What Horovod refuses for them is NotImplementedError here too."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not support IndexedSlices (sparse tensors); pass "
                                  "sparse_as_dense=True to densify them")
    if op not in (Average, Sum):
        raise NotImplementedError("Only Sum and Average reductions are supported with tf.IndexedSlices "
                                  "(or densify them: sparse_as_dense=True)")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale are not supported with tf.IndexedSlices")
    values = mpi_ops.allgather(tensor.values, name=f"{name}.values" if name else None,
                               process_set=process_set, ignore_name_scope=ignore_name_scope)
    indices = mpi_ops.allgather(tensor.indices, name=f"{name}.indices" if name else None,
                                process_set=process_set, ignore_name_scope=ignore_name_scope)
    if op == Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduces tensor over the ranks of the set (default: average). IndexedSlices
    are gathered instead, as Horovod does."""
    op = _reduce_op(op, average, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        with tf.device(device_sparse):
            return _sparse_allreduce(tensor, op, name, process_set, ignore_name_scope, prescale_factor,
                                     postscale_factor)
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        reduced = mpi_ops._allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                     process_set=process_set)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """allreduce of a list as one op (IndexedSlices among them are gathered apart)."""
    op = _reduce_op(op, average, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    out = [None] * len(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            with tf.device(device_sparse):
                out[i] = _sparse_allreduce(t, op, f"{name}.{i}" if name else None, process_set, ignore_name_scope,
                                           prescale_factor, postscale_factor)
    if dense:
        with tf.device(device_dense):
            pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
            reduced = mpi_ops._grouped_allreduce([c for c, _ in pairs], name=name, op=op,
                                                 prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                                 ignore_name_scope=ignore_name_scope, process_set=process_set)
            for i, r, (_, ctx) in zip(dense, reduced, pairs):
                out[i] = compression.decompress(r, ctx)
    return out


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces tensor over the set and returns this rank's slice of the first dimension."""
    if op not in (Average, Sum):
        raise NotImplementedError(f"reducescatter supports op=Average or op=Sum only (as Horovod), got {op!r}")
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        out = mpi_ops._reducescatter(compressed, name=name, op=op, ignore_name_scope=ignore_name_scope,
                                     process_set=process_set, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor)
        return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    if op not in (Average, Sum):
        raise NotImplementedError(f"grouped_reducescatter supports op=Average or op=Sum only, got {op!r}")
    with tf.device(device_dense):
        pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
        outs = mpi_ops._grouped_reducescatter([c for c, _ in pairs], name=name, op=op,
                                              ignore_name_scope=ignore_name_scope, process_set=process_set,
                                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def _tf_variable(v):
    """The tf.Variable behind v (a Keras 3 variable holds one as .value)."""
    return v if isinstance(v, tf.Variable) else getattr(v, "value", v)


@tf.function(autograph=False)
def _broadcast_group(variables, root_rank, set_id):
    # In one graph the broadcasts run side by side (eagerly they would run one by
    # one). Named by position: Keras 3 variable names repeat ("kernel").
    for i, v in enumerate(variables):
        v.assign(mpi_ops._lib.chorus_broadcast(v, root_rank=root_rank, tensor_name=f"broadcast_variables.{i}",
                                               process_set_id=set_id))


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns root_rank's values to variables on every rank of the set."""
    variables = [_tf_variable(v) for v in variables]
    if not variables:
        return None
    if tf.executing_eagerly():
        return _broadcast_group(variables, root_rank, _set_id(process_set))
    return tf.group(*[v.assign(mpi_ops.broadcast(v, root_rank, process_set=process_set)) for v in variables])


def broadcast_global_variables(root_rank):
    """TF1 graphs: root_rank's values for every global variable. Eagerly there are no
    global variables to find: Horovod refuses, and so does this."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; use "
                           "hvd.broadcast_variables(<model/optimizer variables>) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's Python object on every rank of the set (pickled)."""
    return objects.broadcast_object(obj, root_rank, name or type(obj).__name__, _set_id(process_set))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's Python object, in rank order."""
    return objects.allgather_object(obj, name or type(obj).__name__, _set_id(process_set))


__all__ = ["allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter", "broadcast_variables",
           "broadcast_global_variables",
           "broadcast_object", "broadcast_object_fn", "allgather_object", "Adasum"]
