"""Tensor (model) parallelism over chorus process sets: Megatron-style layers, the
vocabulary-parallel cross-entropy, and the ``mpu`` DeepSpeed expects."""
from chorus.parallel import mpu
from chorus.parallel.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                    vocab_parallel_cross_entropy)
from chorus.parallel.mappings import (copy_to_model_parallel_region, gather_from_model_parallel_region,
                                      reduce_from_model_parallel_region, scatter_to_model_parallel_region)

__all__ = ["mpu", "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "copy_to_model_parallel_region", "gather_from_model_parallel_region",
           "reduce_from_model_parallel_region", "scatter_to_model_parallel_region"]
