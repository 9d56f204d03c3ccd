"""deepspeed.utils.groups: the data-parallel group's queries (every rank, unless
pipeline or tensor parallelism split it; see chorus.parallel)."""
import chorus.torch as _hvd


def _get_data_parallel_world_size():
    return _hvd.size() if _hvd.is_initialized() else 1


def _get_data_parallel_rank():
    return _hvd.rank() if _hvd.is_initialized() else 0


def _get_data_parallel_group():
    return _hvd.global_process_set


def _get_sequence_parallel_world_size():
    return 1


def _get_sequence_parallel_rank():
    return 0


def _get_sequence_data_parallel_world_size():
    return _get_data_parallel_world_size()
