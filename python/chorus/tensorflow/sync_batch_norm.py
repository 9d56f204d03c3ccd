"""SyncBatchNormalization (horovod.tensorflow.SyncBatchNormalization): Keras batch
normalization whose training-time mean and variance are those of every rank's
batch together, under Keras 3 and Keras 2 (tf_keras) alike."""
import tensorflow as tf

from chorus.common.process_sets import global_process_set
from chorus.tensorflow._keras import KERAS2, keras
from chorus.tensorflow.mpi_ops import Sum, _grouped_allreduce


def global_moments(x, axes, keep_dims=False, weights=None, process_set=global_process_set):
    """Mean and variance of x over `axes` and over the ranks of the set, in float32 at
    least. Counts and sums are added up first (batches may differ in size), then the
    squared deviations from that mean: two passes, as torch's SyncBatchNorm, because
    E[x^2] - E[x]^2 loses the variance when the mean is large next to the spread."""
    axes = [a % len(x.shape) for a in axes]
    x = tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x
    w = tf.ones_like(x) if weights is None else tf.cast(tf.broadcast_to(weights, tf.shape(x)), x.dtype)
    count = tf.reduce_sum(w, axes, keepdims=True)
    total = tf.reduce_sum(x * w, axes, keepdims=True)
    count, total = _grouped_allreduce([count, total], op=Sum, process_set=process_set)
    count = tf.maximum(count, 1.0)
    mean = total / count
    deviations = tf.reduce_sum(tf.square(x - mean) * w, axes, keepdims=True)
    variance = _grouped_allreduce([deviations], op=Sum, process_set=process_set)[0] / count
    if not keep_dims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization over the whole distributed batch. fused=True is refused
    (as Horovod's): its statistics never leave the rank."""

    def __init__(self, fused=False, process_set=global_process_set, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True")
        if KERAS2:
            kwargs["fused"] = False
        super().__init__(**kwargs)
        self._process_set = process_set

    if KERAS2:
        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
            weights = None if mask is None else tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
            return global_moments(inputs, reduction_axes, keep_dims, weights, self._process_set)
    else:
        def _moments(self, inputs, mask):
            weights = None if mask is None else tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
            return global_moments(inputs, self._reduction_axes, False, weights, self._process_set)
