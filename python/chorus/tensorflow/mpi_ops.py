"""The TensorFlow ops (C++ kernels in src/tensorflow) with horovod.tensorflow's
names, arguments and gradients. Eagerly, an op without a name takes the next
automatic one in call order; in a graph (tf.function) it is named after its
node, so that ops the executor runs in any order still meet their peers."""
import os
import re

import tensorflow as tf
from tensorflow.python.framework import ops

from chorus import _core
from chorus.common import basics as _basics  # noqa: F401 (hvd.mpi_ops._basics, as Horovod has it)
from chorus.common.process_sets import _set_id, _set_of, global_process_set
from chorus.tensorflow.util import _executing_eagerly

from chorus.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (hvd.Sum...)
from chorus.common.reduce_ops import resolve_op as _reduce_op  # noqa: F401

_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_chorus_tf_ops.so")
if not os.path.exists(_LIB_PATH):
    raise ImportError(f"chorus.tensorflow: {_LIB_PATH} is missing: chorus was built without TensorFlow "
                      "(configure with -DCHORUS_TF_PYTHON=<a python with tensorflow>, as scripts/test.sh does)")


class _EagerWaits:
    """The op library, whose eager collectives mark this thread as waiting on their
    process set while they run: TensorFlow completes chorus's ops through callbacks,
    never Work.wait, so without this a rank on another code path (a test that failed
    on one rank) would never count as blocked (CHORUS_BLOCKED_FAIL_SECONDS)."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.startswith("chorus_") or name == "chorus_query":
            return fn

        def call(*args, **kwargs):
            if not _executing_eagerly():
                return fn(*args, **kwargs)
            try:
                token = _core.waiting_elsewhere(kwargs.get("process_set_id", 0))
            except Exception:  # noqa: BLE001 (not a member, not started: the op itself says so)
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                del token
        setattr(self, name, call)  # built once per op
        return call


_lib = _EagerWaits(tf.load_op_library(_LIB_PATH))

# The collectives are stateful ops (TensorFlow must not run them while folding
# constants), but tf.function chains stateful ops in program order, and each
# would then wait for the one before: the ranks match them by name, so they run
# side by side as Horovod's (stateless) ops do, and fuse.
_COLLECTIVES = ("ChorusAllreduce", "ChorusGroupedAllreduce", "ChorusAllgather", "ChorusGroupedAllgather",
                "ChorusBroadcast", "ChorusAlltoall", "ChorusReducescatter", "ChorusGroupedReducescatter")
try:
    from tensorflow.python.framework import auto_control_deps as _acd
    _acd.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS = frozenset(_acd.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS) | \
        frozenset(_COLLECTIVES)
except (ImportError, AttributeError):  # another TensorFlow layout: program order (correct, slower)
    pass


def _normalize_name(name):
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _names(kind, tensor_name, name, ignore_name_scope):
    """(tensor_name attr, node name) for an op about to be created."""
    if _executing_eagerly():
        return name or "", None
    base = name or f"Chorus{kind}_{_normalize_name(tensor_name)}"
    full = ops.get_default_graph().unique_name(base, mark_as_used=False)
    # The node gets `full` (scope and all); ignore_name_scope keeps only its last part.
    return (full.rsplit("/", 1)[-1] if ignore_name_scope else full), base


def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set, priority=0):
    tname, node = _names("Allreduce", getattr(tensor, "name", ""), name, ignore_name_scope)
    return _lib.chorus_allreduce(tensor, reduce_op=op, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, tensor_name=tname,
                                 process_set_id=_set_id(process_set), priority=priority, name=node)


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set, priority=0):
    tname, node = _names("GroupedAllreduce", f"{tensors[0].name}_{tensors[-1].name}"
                         if not _executing_eagerly() else "", name, ignore_name_scope)
    return _lib.chorus_grouped_allreduce(tensors, reduce_op=op, prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor, tensor_name=tname,
                                         process_set_id=_set_id(process_set), priority=priority, name=node)


@ops.RegisterGradient("ChorusAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of an allreduce is the same allreduce of the gradient (Horovod's)."""
    return _lib.chorus_allreduce(grad, reduce_op=op.get_attr("reduce_op"),
                                 prescale_factor=op.get_attr("prescale_factor"),
                                 postscale_factor=op.get_attr("postscale_factor"),
                                 tensor_name=_grad_name(op), process_set_id=op.get_attr("process_set_id"))


@ops.RegisterGradient("ChorusGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _lib.chorus_grouped_allreduce(list(grads), reduce_op=op.get_attr("reduce_op"),
                                         prescale_factor=op.get_attr("prescale_factor"),
                                         postscale_factor=op.get_attr("postscale_factor"),
                                         tensor_name=_grad_name(op),
                                         process_set_id=op.get_attr("process_set_id"))


def _grad_name(op, suffix="grad"):
    """A gradient op's name: its forward op's with a suffix (graphs), automatic eagerly."""
    forward = op.get_attr("tensor_name") if not _executing_eagerly() else ""
    if isinstance(forward, bytes):  # string attrs read back as bytes
        forward = forward.decode()
    return f"{forward}.{suffix}" if forward else ""


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set, priority=0):
    """Concatenates every rank's tensor along the first dimension (which may differ between ranks)."""
    tname, node = _names("Allgather", getattr(tensor, "name", ""), name, ignore_name_scope)
    return _lib.chorus_allgather(tensor, tensor_name=tname, process_set_id=_set_id(process_set),
                                 priority=priority, name=node)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set, priority=0):
    tname, node = _names("GroupedAllgather", f"{tensors[0].name}_{tensors[-1].name}"
                         if not _executing_eagerly() else "", name, ignore_name_scope)
    return _lib.chorus_grouped_allgather(tensors, tensor_name=tname, process_set_id=_set_id(process_set),
                                         priority=priority, name=node)


def _first_dims(x, set_id, name):
    """Every rank's first dimension of x, as an int32 vector (for splitting gradients)."""
    d = tf.reshape(tf.shape(x, out_type=tf.int32)[0], [1])
    return _lib.chorus_allgather(d, tensor_name=name, process_set_id=set_id)


@ops.RegisterGradient("ChorusAllgather")
def _allgather_grad(op, grad):
    """Horovod's: the averaged gradient, this rank's rows of it."""
    set_id = op.get_attr("process_set_id")
    ps = _set_of(set_id)
    grad = _lib.chorus_allreduce(grad, reduce_op=Average, tensor_name=_grad_name(op), process_set_id=set_id)
    dims = _first_dims(op.inputs[0], set_id, _grad_name(op, "grad.dims"))
    return tf.split(grad, num_or_size_splits=dims, axis=0, num=ps.size())[ps.rank()]


@ops.RegisterGradient("ChorusGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    set_id = op.get_attr("process_set_id")
    ps = _set_of(set_id)
    out = []
    for i, (x, g) in enumerate(zip(op.inputs, grads)):
        g = _lib.chorus_allreduce(g, reduce_op=Average, tensor_name=_grad_name(op, f"grad.{i}"),
                                  process_set_id=set_id)
        dims = _first_dims(x, set_id, _grad_name(op, f"grad.{i}.dims"))
        out.append(tf.split(g, num_or_size_splits=dims, axis=0, num=ps.size())[ps.rank()])
    return out


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set, priority=0):
    """root_rank's tensor on every rank (root_rank is a global rank)."""
    tname, node = _names("Broadcast", getattr(tensor, "name", ""), name, ignore_name_scope)
    return _lib.chorus_broadcast(tensor, root_rank=root_rank, tensor_name=tname,
                                 process_set_id=_set_id(process_set), priority=priority, name=node)


@ops.RegisterGradient("ChorusBroadcast")
def _broadcast_grad(op, grad):
    """Horovod's: the averaged gradient on the root, zeros elsewhere."""
    from chorus.common.basics import rank
    reduced = _lib.chorus_allreduce(grad, reduce_op=Average, tensor_name=_grad_name(op),
                                    process_set_id=op.get_attr("process_set_id"))
    return reduced if rank() == op.get_attr("root_rank") else reduced * 0


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrites variables in place with root_rank's values; returns their new values."""
    variables = list(variables)
    if not variables:
        return []
    base = name or "broadcast_"
    out = []
    for v in variables:
        got = broadcast(tf.convert_to_tensor(v), root_rank,
                        name=f"{base}.{_normalize_name(v.name)}" if _executing_eagerly() else None,
                        process_set=process_set)
        if _executing_eagerly():
            v.assign(got)
            out.append(v.read_value() if hasattr(v, "read_value") else got)
        else:  # in a graph the value returned is the assignment's, so fetching it runs the assignment
            out.append(v.assign(got, read_value=True))
    return out


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set, priority=0):
    """Sends splits[i] rows of tensor to rank i of the set and gathers what each sent here.
    Returns the gathered tensor, and with splits given also the rows received from each rank."""
    splits_ = tf.convert_to_tensor(splits, dtype=tf.int32) if splits is not None else tf.constant([], tf.int32)
    tname, node = _names("Alltoall", getattr(tensor, "name", ""), name, ignore_name_scope)
    output, received = _lib.chorus_alltoall(tensor, splits_, tensor_name=tname, process_set_id=_set_id(process_set),
                                            priority=priority, name=node)
    return (output, received) if splits is not None else output


@ops.RegisterGradient("ChorusAlltoall")
def _alltoall_grad(op, grad_wrt_output, grad_wrt_received_splits):
    """Horovod's: the gradient goes back along the reverse alltoall."""
    grad, _ = _lib.chorus_alltoall(grad_wrt_output, op.outputs[1], tensor_name=_grad_name(op),
                                   process_set_id=op.get_attr("process_set_id"))
    return [grad, None]


def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                   prescale_factor=1.0, postscale_factor=1.0, priority=0):
    tname, node = _names("Reducescatter", getattr(tensor, "name", ""), name, ignore_name_scope)
    return _lib.chorus_reducescatter(tensor, reduce_op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, tensor_name=tname,
                                     process_set_id=_set_id(process_set), priority=priority, name=node)


def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                           prescale_factor=1.0, postscale_factor=1.0, priority=0):
    tname, node = _names("GroupedReducescatter", f"{tensors[0].name}_{tensors[-1].name}"
                         if not _executing_eagerly() else "", name, ignore_name_scope)
    return _lib.chorus_grouped_reducescatter(tensors, reduce_op=op, prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor, tensor_name=tname,
                                             process_set_id=_set_id(process_set), priority=priority, name=node)


def _reducescatter_grad_of(op, grad, i=None):
    """Horovod's: the gradient scaled by the set's size for a sum, then gathered."""
    set_id = op.get_attr("process_set_id")
    if op.get_attr("reduce_op") == Sum:
        grad = grad * _set_of(set_id).size()
    return _lib.chorus_allgather(grad, tensor_name=_grad_name(op, "grad" if i is None else f"grad.{i}"),
                                 process_set_id=set_id)


@ops.RegisterGradient("ChorusReducescatter")
def _reducescatter_grad(op, grad):
    return _reducescatter_grad_of(op, grad)


@ops.RegisterGradient("ChorusGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    return [_reducescatter_grad_of(op, g, i) for i, g in enumerate(grads)]


def join(process_set=global_process_set):
    """This rank has no more data: it stands in for the collectives the others
    still run until every rank has joined. Returns the last rank to join."""
    return _lib.chorus_join(process_set_id=_set_id(process_set))


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier()."""
    return _lib.chorus_barrier(process_set_id=_set_id(process_set))


def size_op(process_set_id=0, name=None):
    """The set's size, read when the graph runs."""
    return _lib.chorus_query(what="size", process_set_id=process_set_id, name=name)


def local_size_op(name=None):
    return _lib.chorus_query(what="local_size", name=name)


def rank_op(name=None):
    return _lib.chorus_query(what="rank", name=name)


def local_rank_op(name=None):
    return _lib.chorus_query(what="local_rank", name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank is in the set, else 0, read when the graph runs."""
    return _lib.chorus_query(what="process_set_included", process_set_id=process_set_id, name=name)


for _op in ("ChorusBarrier", "ChorusJoin", "ChorusQuery"):
    ops.NotDifferentiable(_op)
