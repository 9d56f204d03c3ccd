"""The Keras 2 distributed optimizer (tf_keras, what tf.keras is under
TF_USE_LEGACY_KERAS=1): any Keras 2 optimizer, the legacy OptimizerV2 kind
(`keras.optimizers.legacy.*`, `_compute_gradients`, `get_gradients`) or the
2.11+ kind, whose gradients are averaged over the ranks before they are applied.

Gradients are reduced once per step: in _compute_gradients / compute_gradients /
get_gradients when the caller goes through them (minimize, model.fit), else in
apply_gradients. With backward_passes_per_step > 1, apply_gradients sums the
local gradients and every bpps-th call reduces the sum (or its mean) and applies
it; the other calls only count the step (`iterations`), as Horovod's do.
"""
import tensorflow as tf

from chorus.tensorflow.gradient_tape import GradientReducer


class _Aggregation:
    """backward_passes_per_step's local sums and their counter (Horovod's _agg_helper)."""

    def __init__(self, bpps, average):
        self.bpps, self.average = bpps, average
        self.counter = None
        self.sums = None

    def build(self, variables):
        if self.counter is None:
            with tf.init_scope():
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="chorus_agg_counter")
                self.sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]


class _DistributedKeras2Optimizer:
    """Mixed in before the wrapped optimizer's class. Its settings are class
    attributes, so that copies made with from_config() reduce as well."""

    _chorus_reducer = None
    _chorus_bpps = 1
    _chorus_average_aggregated = False
    _chorus_local = frozenset()
    _chorus_scale_local = True

    def register_local_var(self, var):
        """var's gradients stay this rank's own (scaled as the averaged ones are)."""
        from chorus.tensorflow.functions import _tf_variable
        self._chorus_local = frozenset(self._chorus_local) | {id(_tf_variable(var))}

    def _chorus_reduce(self, grads, variables):
        return self._chorus_reducer.partial(grads, variables, set(self._chorus_local), self._chorus_scale_local)

    def _chorus_reduced(self, grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars]
        if self._chorus_bpps > 1:
            return pairs  # reduced in apply_gradients, once the local sums are complete
        grads = self._chorus_reduce([g for g, _ in pairs], [v for _, v in pairs])
        self._chorus_done = True
        return list(zip(grads, [v for _, v in pairs]))

    # The legacy optimizer's (minimize, model.fit) and the 2.11+ optimizer's gradient paths.
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        return self._chorus_reduced(super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape))

    def compute_gradients(self, loss, var_list, tape=None):
        return self._chorus_reduced(super().compute_gradients(loss, var_list, tape=tape))

    def get_gradients(self, loss, params):
        grads = super().get_gradients(loss, params)
        if self._chorus_bpps > 1:
            return grads
        return self._chorus_reduce(list(grads), list(params))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = [(g, v) for g, v in grads_and_vars]
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._chorus_bpps > 1:
            return self._chorus_accumulate(grads, variables, args, kwargs)
        if not getattr(self, "_chorus_done", False):
            grads = self._chorus_reduce(grads, variables)
        self._chorus_done = False
        return super().apply_gradients(zip(grads, variables), *args, **kwargs)

    def _chorus_accumulate(self, grads, variables, args, kwargs):
        helper = self.__dict__.get("_agg_helper")
        if helper is None:
            helper = self._agg_helper = _Aggregation(self._chorus_bpps, self._chorus_average_aggregated)
        helper.build(variables)
        for s, g in zip(helper.sums, grads):
            if g is not None:
                s.assign_add(tf.convert_to_tensor(g))
        count = helper.counter.assign_add(1)
        present = [g is not None for g in grads]
        apply = super().apply_gradients

        def step():
            scale = 1.0 / helper.bpps if helper.average else 1.0
            summed = [s.read_value() * scale if p else None for s, p in zip(helper.sums, present)]
            reduced = self._chorus_reduce(summed, variables)
            apply([(g, v) for g, v in zip(reduced, variables) if g is not None], *args, **kwargs)
            for s in helper.sums:
                s.assign(tf.zeros_like(s))
            helper.counter.assign(0)
            return tf.constant(True)

        def count_only():
            self.iterations.assign_add(1)  # the step counts, as the applying ones do
            return tf.constant(False)

        if tf.executing_eagerly():
            return step() if int(count) == helper.bpps else count_only()
        return tf.cond(tf.equal(count, helper.bpps), step, count_only)


def distributed_class(base):
    """The class DistributedOptimizer makes for a Keras 2 optimizer class."""
    while getattr(base, "_chorus_made", False):
        base = base.__bases__[-1]
    return type(base.__name__, (_DistributedKeras2Optimizer, base), {"__module__": base.__module__,
                                                                     "_chorus_made": True})


def distribute(optimizer, reducer, bpps, average_aggregated, scale_local, local=()):
    """A Keras 2 optimizer like `optimizer` (a new one, from its config) that reduces its
    gradients; `local`: ids of variables whose gradients stay this rank's own."""
    cls = distributed_class(optimizer.__class__)
    cls._chorus_reducer = reducer
    cls._chorus_bpps = int(bpps)
    cls._chorus_average_aggregated = bool(average_aggregated)
    cls._chorus_scale_local = scale_local
    cls._chorus_local = frozenset(local)
    return cls.from_config(optimizer.get_config())


def keras2_optimizer_types():
    """The Keras 2 optimizer base classes: tf_keras's, and the `keras` package's
    where that is Keras 2 (TensorFlow before 2.16). Empty when neither is."""
    import importlib
    types = []
    for name in ("tf_keras", "keras"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if str(getattr(mod, "__version__", "2")).startswith("2"):
            for t in (mod.optimizers.Optimizer, getattr(getattr(mod.optimizers, "legacy", None), "Optimizer", None)):
                if t is not None and t not in types:
                    types.append(t)
    return tuple(types)


def is_keras2_optimizer(optimizer):
    types = keras2_optimizer_types()
    return bool(types) and isinstance(optimizer, types)


def is_distributed(optimizer):
    return isinstance(optimizer, _DistributedKeras2Optimizer)
