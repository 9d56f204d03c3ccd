"""Helpers of Horovod's horovod.tensorflow.util that Horovod code reaches for."""
import tensorflow as tf


def _executing_eagerly():
    """Whether TensorFlow runs eagerly here (outside a tf.function or a v1 graph)."""
    return tf.executing_eagerly()
