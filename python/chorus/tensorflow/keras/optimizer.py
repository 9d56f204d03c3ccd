"""horovod.tensorflow.keras.DistributedOptimizer: any Keras optimizer whose
gradients are averaged over the ranks before they are applied. Keras 3's here
(its apply()); Keras 2's (tf_keras) in optimizer_keras2."""
import keras
import tensorflow as tf

from chorus.common.process_sets import global_process_set
from chorus.tensorflow._keras import loss_scale_optimizer_type
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.functions import _tf_variable
from chorus.tensorflow.gradient_tape import GradientReducer
from chorus.tensorflow.keras import optimizer_keras2
from chorus.tensorflow.mpi_ops import Average


class _DistributedKerasOptimizer:
    """Mixed in before the wrapped optimizer's class (see DistributedOptimizer)."""

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        grads, trainable_variables = list(grads), list(trainable_variables)
        if self._chorus_bpps > 1:
            return self._chorus_accumulate(grads, trainable_variables)
        return super().apply(self._chorus_reduce(grads, trainable_variables), trainable_variables)

    def register_local_var(self, var):
        """var's gradients stay this rank's own (scaled as the averaged ones are)."""
        self._chorus_local.add(id(_tf_variable(var)))

    def _chorus_reduce(self, grads, variables):
        return self._chorus_reducer.partial(grads, variables, self._chorus_local, self._chorus_scale_local)

    def _chorus_accumulate(self, grads, variables):
        """backward_passes_per_step: sums gradients locally; every bpps-th call
        reduces the sum (or its mean, average_aggregated_gradients) and applies it."""
        if not self.built:
            self.build(variables)  # not inside the cond below
        if self._chorus_acc is None:
            with tf.init_scope():
                self._chorus_acc = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
                self._chorus_count = tf.Variable(0, dtype=tf.int64, trainable=False)
        for a, g in zip(self._chorus_acc, grads):
            if g is not None:
                a.assign_add(tf.convert_to_tensor(g))
        count = self._chorus_count.assign_add(1)
        present = [g is not None for g in grads]
        apply = super().apply

        def step():
            scale = 1.0 / self._chorus_bpps if self._chorus_average_aggregated else 1.0
            summed = [a.read_value() * scale if p else None for a, p in zip(self._chorus_acc, present)]
            apply(self._chorus_reduce(summed, variables), variables)
            for a in self._chorus_acc:
                a.assign(tf.zeros_like(a))
            return tf.constant(True)

        if tf.executing_eagerly():
            if int(count) % self._chorus_bpps == 0:
                step()
            return None
        tf.cond(count % self._chorus_bpps == 0, step, lambda: tf.constant(False))
        return None


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A Keras 3 optimizer like `optimizer` (a new one, from its config) that
    averages gradients over the ranks before applying them.

    Under the mixed_float16 policy the optimizer is first wrapped in Keras's
    LossScaleOptimizer, so that the (scaled) gradients are reduced before the
    loss scaler checks them: every rank then takes the same skip-or-apply branch."""
    return _distributed(optimizer, device_dense, device_sparse, compression, sparse_as_dense,
                        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
                        num_groups, groups, process_set, scale_local_gradients, ())


def _distributed(optimizer, device_dense, device_sparse, compression, sparse_as_dense, gradient_predivide_factor,
                 op, backward_passes_per_step, average_aggregated_gradients, num_groups, groups, process_set,
                 scale_local_gradients, local):
    keras2 = optimizer_keras2.is_keras2_optimizer(optimizer)
    if not keras2 and not (keras.__version__.startswith("3") and isinstance(optimizer, keras.optimizers.Optimizer)):
        raise TypeError(f"DistributedOptimizer needs a Keras optimizer (Keras 3, or Keras 2 from tf_keras), "
                        f"got {type(optimizer).__name__}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    reducer = GradientReducer(device_dense, device_sparse, compression, sparse_as_dense, op,
                              gradient_predivide_factor, num_groups, groups, process_set)
    if keras2:
        import importlib
        k2 = importlib.import_module(next(c.__module__.split(".")[0] for c in type(optimizer).__mro__
                                          if c.__module__.split(".")[0] in ("tf_keras", "keras")))
        lso = k2.mixed_precision.LossScaleOptimizer
        if k2.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(optimizer, lso):
            optimizer = lso(optimizer)
        return optimizer_keras2.distribute(optimizer, reducer, backward_passes_per_step,
                                           average_aggregated_gradients, scale_local_gradients, local)
    lso = keras.optimizers.LossScaleOptimizer
    if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(optimizer, lso):
        optimizer = lso(optimizer)
    base = optimizer.__class__
    while getattr(base, "_chorus_made", False):  # (a class made here: start from the optimizer's own)
        base = base.__bases__[-1]
    cls = type(base.__name__, (_DistributedKerasOptimizer, base), {"__module__": base.__module__, "_chorus_made": True})
    dist = cls.from_config(optimizer.get_config())
    dist._chorus_reducer = reducer
    dist._chorus_bpps = int(backward_passes_per_step)
    dist._chorus_average_aggregated = bool(average_aggregated_gradients)
    dist._chorus_acc = None
    dist._chorus_local = set(local)
    dist._chorus_scale_local = scale_local_gradients
    return dist


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose local_layers keep their own gradients (each rank
    trains its copy of them), as Horovod's PartialDistributedOptimizer."""
    layers = local_layers if isinstance(local_layers, (list, tuple)) else ([local_layers] if local_layers else [])
    local = set()
    for layer in layers:
        if not hasattr(layer, "trainable_weights") or not hasattr(layer, "built"):
            raise ValueError(f"local_layers must hold Keras layers, got {type(layer).__name__}")
        local.update(id(_tf_variable(v)) for v in layer.trainable_weights)
    return _distributed(optimizer, device_dense, device_sparse, compression, sparse_as_dense,
                        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients, 0,
                        groups, process_set, scale_local_gradients, local)


def is_distributed(optimizer):
    return isinstance(optimizer, _DistributedKerasOptimizer) or optimizer_keras2.is_distributed(optimizer)


def _wrap_class(base, alternatives=(), **kwargs):
    """A stand-in for optimizer class `base` when a saved model is loaded: what
    it deserializes comes back distributed (hvd.load_model). alternatives: Keras
    2's classes of one name (legacy and 2.11+); the saved config says which."""
    def from_config(cls, config, custom_objects=None):
        chosen = base
        for alt in alternatives:
            if (".legacy." in alt.__module__) == bool(config.get("is_legacy_optimizer", False)):
                chosen = alt
                break
        keras2 = optimizer_keras2.keras2_optimizer_types()
        if issubclass(chosen, loss_scale_optimizer_type()) or (keras2 and issubclass(chosen, keras2)):
            inner = chosen.from_config(config, custom_objects=custom_objects)
        else:
            inner = chosen.from_config(config)
        return DistributedOptimizer(inner, **kwargs)

    return type(base.__name__, (base,), {"from_config": classmethod(from_config), "__module__": base.__module__,
                                         "_chorus_made": True})
