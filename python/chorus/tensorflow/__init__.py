"""Horovod-compatible TensorFlow 2 API: ``import chorus.tensorflow as hvd``.

The collectives are TensorFlow ops (C++ kernels over chorus's runtime), usable
eagerly and in tf.function, with Horovod's gradients. Keras: chorus.tensorflow.keras.
"""
from chorus.common.basics import (ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built,
                                  ddl_built, gloo_built, gloo_enabled, global_process_set, init, is_homogeneous,
                                  is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                                  mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built,
                                  shutdown, size, start_timeline, stop_timeline)
from chorus.common.util import check_extension, gpu_available, split_list
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, alltoall, barrier,
                                       broadcast, broadcast_, grouped_allgather, join, local_rank_op,
                                       local_size_op, process_set_included_op, rank_op, size_op)
from chorus.tensorflow.functions import (allgather_object, allreduce, broadcast_global_variables,
                                         broadcast_object, broadcast_object_fn, broadcast_variables, grouped_allreduce, grouped_reducescatter,
                                         reducescatter)
from chorus.tensorflow.gradient_tape import DistributedGradientTape
from chorus.tensorflow.util import _executing_eagerly  # noqa: F401 (hvd._executing_eagerly, as Horovod has it)
from chorus.tensorflow.optimizer import DistributedOptimizer
from chorus.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from chorus.tensorflow import elastic  # noqa: E402
from chorus.tensorflow.keras import callbacks  # noqa: E402 (the seed writes hvd.callbacks with this import)
from chorus._core import HorovodInternalError  # noqa: E402 (a blocking helper's peer failure)
