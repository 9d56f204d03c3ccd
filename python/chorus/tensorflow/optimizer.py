"""hvd.DistributedOptimizer in chorus.tensorflow: a Keras optimizer becomes the
Keras distributed optimizer; a tf.compat.v1 optimizer averages in compute_gradients."""
import tensorflow as tf

from chorus.common.process_sets import global_process_set
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.gradient_tape import GradientReducer
from chorus.tensorflow.mpi_ops import Average


class _DistributedV1Optimizer:
    def compute_gradients(self, *args, **kwargs):
        pairs = super().compute_gradients(*args, **kwargs)
        grads, variables = zip(*pairs) if pairs else ((), ())
        return list(zip(self._chorus_reducer(list(grads), list(variables)), variables))


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps an optimizer so that the gradients it applies are averaged over the ranks."""
    import keras
    from chorus.tensorflow.keras.optimizer_keras2 import is_keras2_optimizer
    if is_keras2_optimizer(optimizer) or isinstance(optimizer, keras.optimizers.Optimizer):
        from chorus.tensorflow.keras.optimizer import DistributedOptimizer as keras_distributed
        return keras_distributed(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                 gradient_predivide_factor, op, backward_passes_per_step,
                                 average_aggregated_gradients, num_groups, groups, process_set,
                                 scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError("backward_passes_per_step > 1 is supported for Keras optimizers only")
        base = optimizer.__class__
        cls = type(base.__name__, (_DistributedV1Optimizer, base), {"__module__": base.__module__})
        dist = cls.__new__(cls)
        dist.__dict__.update(optimizer.__dict__)
        dist._optimizer = optimizer  # the wrapped one, where Horovod's keeps it
        dist._chorus_reducer = GradientReducer(device_dense, device_sparse, compression, sparse_as_dense, op,
                                               gradient_predivide_factor, num_groups, groups, process_set)
        return dist
    raise TypeError(f"DistributedOptimizer needs a Keras optimizer (Keras 3, or Keras 2 from tf_keras) or a "
                    f"tf.compat.v1 optimizer, got {type(optimizer).__name__}")
