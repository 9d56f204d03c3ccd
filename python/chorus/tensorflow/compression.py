"""Gradient compression, as horovod.tensorflow.Compression."""
import tensorflow as tf

from chorus.common.compression import Compressor, NoneCompressor  # noqa: F401 (hvd.Compressor)


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and restores their dtype after."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
