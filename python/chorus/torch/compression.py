"""Gradient compression, as horovod.torch.Compression."""
import torch

from chorus.common.compression import Compressor, NoneCompressor  # noqa: F401 (hvd.Compressor)


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and restores their dtype after."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
