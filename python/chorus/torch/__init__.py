"""Horovod-compatible PyTorch API: ``import chorus.torch as hvd``."""
from chorus.common.basics import (ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built,
                                 ddl_built, gloo_built, gloo_enabled, global_process_set, init,
                                 is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                                 mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set,
                                 rocm_built, shutdown, size, start_timeline, stats, stop_timeline)
from chorus.torch.compression import Compression
from chorus.common.util import check_extension, gpu_available, split_list
from chorus.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                    broadcast_parameters)
from chorus.torch.mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, MismatchError,
                                  Product, Sum, allgather, allgather_async, allreduce, allreduce_,
                                  allreduce_async, allreduce_async_, alltoall, alltoall_async,
                                  barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
                                  grouped_allgather, grouped_allgather_async, grouped_allreduce,
                                  grouped_allreduce_, grouped_allreduce_async,
                                  grouped_allreduce_async_, grouped_reducescatter,
                                  grouped_reducescatter_async, join, poll, reducescatter,
                                  reducescatter_async, sparse_allreduce_async, synchronize)
from chorus.torch.p2p import P2POp, P2PWork, batch_isend_irecv, irecv, isend, recv, send
from chorus.torch.optimizer import DistributedOptimizer
from chorus.torch.sync_batch_norm import SyncBatchNorm
from chorus.torch import elastic  # noqa: E402  (hvd.elastic.run, as horovod.torch has it)
from chorus.torch.elastic import HostsUpdatedInterrupt  # noqa: E402
