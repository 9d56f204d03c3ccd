"""Horovod-compatible Keras API: ``import chorus.tensorflow.keras as hvd``, for the
Keras that tf.keras is (Keras 3, or Keras 2 from tf_keras under TF_USE_LEGACY_KERAS=1)."""
import tensorflow as tf

from chorus.common.basics import (ProcessSet, add_process_set, cross_rank, cross_size, global_process_set, init,
                                  is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                                  mpi_threads_supported, gloo_built, gloo_enabled, nccl_built, rank,
                                  remove_process_set, shutdown, size, start_timeline, stop_timeline)
from chorus.tensorflow import functions as _functions
from chorus.tensorflow._keras import keras, optimizer_variables
from chorus.tensorflow import mpi_ops as _mpi_ops
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.functions import allgather_object, broadcast_object
from chorus.tensorflow.mpi_ops import Adasum, Average, Max, Min, Product, Sum
from chorus.tensorflow.keras import callbacks
from chorus.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer, is_distributed


def _numpy(t):
    return t.numpy() if hasattr(t, "numpy") else t


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set):
    """A value (number, array, tensor) reduced over the ranks, as a tensor (as Horovod's)."""
    return _functions.allreduce(tf.convert_to_tensor(value), average=average, op=op, name=name,
                                prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                compression=compression, process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    return _numpy(_mpi_ops.allgather(tf.convert_to_tensor(value), name=name,
                                                         process_set=process_set))


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    return _numpy(_mpi_ops.broadcast(tf.convert_to_tensor(value), root_rank,
                                                         name=name, process_set=process_set))


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    return _numpy(_functions.reducescatter(tf.convert_to_tensor(value), op=op,
                                                               name=name, process_set=process_set))


def broadcast_global_variables(root_rank, model=None):
    """Horovod's Keras helper: with TF2 there are no global variables; pass the
    model (its and its optimizer's variables are broadcast)."""
    if model is None:
        raise ValueError("broadcast_global_variables needs the model under TensorFlow 2 (no global collection)")
    variables = list(model.variables) + optimizer_variables(model.optimizer)
    _functions.broadcast_variables(variables, root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               **distributed_kwargs):
    """keras.models.load_model, with the saved optimizer wrapped in DistributedOptimizer."""
    from chorus.tensorflow.keras.optimizer import _wrap_class
    from chorus.tensorflow._keras import KERAS2
    objs = {}
    classes = _optimizer_classes() + list(custom_optimizers or [])
    for c in classes:
        objs[c.__name__] = _wrap_class(c, compression=compression, **distributed_kwargs)
    if KERAS2:  # Keras 2 looks optimizers up by lower-case name, legacy or not by the saved config
        by_name = {}
        for c in classes:
            by_name.setdefault(c.__name__.lower(), []).append(c)
        for name, found in by_name.items():
            objs[name] = _wrap_class(found[0], alternatives=found, compression=compression, **distributed_kwargs)
    objs.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objs)


def _optimizer_classes():
    """Keras's own optimizer classes (subclasses of any depth, Keras 3's and Keras 2's
    legacy and current ones), not those made here."""
    from chorus.tensorflow.keras.optimizer_keras2 import keras2_optimizer_types
    roots = [keras.optimizers.Optimizer] + list(keras2_optimizer_types())
    found, unvisited = [], list(roots)
    while unvisited:
        for sub in unvisited.pop().__subclasses__():
            if sub not in found and sub.__module__.split(".")[0] in ("keras", "tf_keras") and \
                    not getattr(sub, "_chorus_made", False):
                found.append(sub)
                unvisited.append(sub)
    return found


from chorus.tensorflow.keras import elastic  # noqa: E402
