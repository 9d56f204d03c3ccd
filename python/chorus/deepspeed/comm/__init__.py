"""deepspeed.comm: DeepSpeed's communication API. As DeepSpeed's own does, it runs
on torch.distributed, which init_distributed starts beside chorus's runtime (on the
MASTER_ADDR/MASTER_PORT every chorus launcher leaves it); before that, or when a
program never starts torch.distributed, the queries and collectives go to chorus."""
import functools
import inspect
import os
from datetime import timedelta

import torch
import torch.distributed as _dist

import chorus.torch as _hvd
from chorus.deepspeed.comm.comms_logging import CommsLogger

comms_logger = CommsLogger()

ReduceOp = _dist.ReduceOp
default_pg_timeout = timedelta(minutes=30)
_HVD_OPS = {ReduceOp.SUM: _hvd.Sum, ReduceOp.MAX: _hvd.Max, ReduceOp.MIN: _hvd.Min, ReduceOp.PRODUCT: _hvd.Product}
_AVG = getattr(ReduceOp, "AVG", None)


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=default_pg_timeout, init_method=None, dist_init_required=None, config=None, rank=-1,
                     world_size=-1):
    """Starts chorus (process sets may be added at run time, for pipeline and
    tensor-parallel groups) and torch.distributed's default group, unless running."""
    if not _hvd.is_initialized():
        _hvd.init(process_sets="dynamic")
    if _dist.is_initialized():
        _keep_torch_groups_at_exit()
    if dist_init_required is False or _dist.is_initialized():
        return
    if os.environ.get("CHORUS_ELASTIC_WORKER"):
        return  # an elastic round re-forms chorus; torch.distributed's group could not follow it
    if dist_backend is None:
        from chorus.deepspeed.accelerator import get_accelerator
        dist_backend = get_accelerator().communication_backend_name()
    _dist.init_process_group(backend=dist_backend, init_method=init_method or "env://", timeout=timeout,
                             rank=_hvd.rank(), world_size=_hvd.size())
    _keep_torch_groups_at_exit()


_keeping = []


def _keep_torch_groups_at_exit():
    """torch.distributed's groups are left to the process's exit, as DeepSpeed leaves
    them, and never destroyed while the interpreter finalizes: ~ProcessGroupGloo
    joins its worker threads holding the GIL, and a worker still releasing a
    finished work's tensors waits for the GIL, so a finished program hung there."""
    if _keeping:
        return
    import atexit
    _keeping.append(True)
    atexit.register(_keep_groups)


def _keep_groups():
    import ctypes
    import time
    if _dist.is_initialized():
        try:  # every rank done and no work in flight (the wait releases the GIL)
            _dist.barrier(async_op=True).wait(timeout=timedelta(seconds=30))
        except Exception:  # noqa: BLE001 (a peer gone: nothing to wait for)
            pass
        # The barrier's work completes before the worker that ran an earlier work has
        # dropped it; a moment with the GIL free lets it. (Kept groups never run their
        # destructor, so this only spares that worker a wait at finalization.)
        time.sleep(0.05)
    from torch.distributed import distributed_c10d as c10d
    world = getattr(c10d, "_world", None)  # torch >= 2.0; torch 1.x keeps the map in _pg_map
    groups = list(getattr(world, "pg_map", None) or getattr(c10d, "_pg_map", None) or {})
    groups.append(c10d.GroupMember.WORLD)
    for group in groups:
        if group is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))  # outlives finalization: no destructor runs


def is_initialized():
    return _dist.is_initialized() or _hvd.is_initialized()


def is_available():
    return True


def _torch(group=None):
    """Whether torch.distributed carries this call: not for a chorus process set
    (deepspeed.utils.groups' expert and sequence groups are those)."""
    return _dist.is_initialized() and not isinstance(group, _hvd.ProcessSet)


def _msg_bytes(name, bound):
    """The message size DeepSpeed's logger counts for one call: each rank's part."""
    args = bound.arguments
    for key in ({"all_gather_into_tensor": "tensor", "reduce_scatter_tensor": "output_tensor"}.get(name, ""),
                "tensor", "output_tensor", "output"):
        if torch.is_tensor(args.get(key)):
            return args[key].numel() * args[key].element_size()
    return 0


def _logged(default_name):
    """DeepSpeed's prof/log_name/debug arguments; a call that goes to torch.distributed is
    timed here (chorus's own collectives are in its op log)."""
    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, prof=False, log_name=None, debug=None, **kwargs):
            name = log_name or default_name
            if not comms_logger.enabled:
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            group = bound.arguments.get("group")
            if not _torch(group) or not (prof or comms_logger.profiles(name)):
                result = fn(*args, **kwargs)
                if comms_logger.verbose:  # each op's line as it completes
                    comms_logger.drain()
                return result
            with comms_logger.timed(name, _msg_bytes(default_name, bound), get_world_size(group)):
                return fn(*args, **kwargs)
        return call
    return wrap


def _set(group):
    return group if isinstance(group, _hvd.ProcessSet) else _hvd.global_process_set


def get_rank(group=None):
    if _torch(group):
        return _dist.get_rank(group)
    if isinstance(group, _hvd.ProcessSet):
        return group.rank()
    return _hvd.rank() if _hvd.is_initialized() else 0


def get_world_size(group=None):
    if _torch(group):
        return _dist.get_world_size(group)
    if isinstance(group, _hvd.ProcessSet):
        return group.size()
    return _hvd.size() if _hvd.is_initialized() else 1


def get_local_rank():
    return _hvd.local_rank() if _hvd.is_initialized() else int(os.environ.get("LOCAL_RANK", 0))


def get_world_group():
    return _dist.group.WORLD if _torch() else None


def get_global_rank(group=None, group_rank=0):
    if isinstance(group, _hvd.ProcessSet):
        return group.ranks[group_rank]
    return _dist.get_global_rank(group, group_rank) if _torch(group) and group is not None else group_rank


@_logged("barrier")
def barrier(group=None, async_op=False, device_ids=None):
    if _torch(group):
        return _dist.barrier(group=group, async_op=async_op)
    _hvd.barrier(process_set=_set(group))


def new_group(ranks):
    return _dist.new_group(ranks)


@_logged("all_reduce")
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    if _torch(group):
        return _dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    if _AVG is not None and op == _AVG:
        _hvd.allreduce_(tensor, op=_hvd.Average, process_set=_set(group))
    else:
        _hvd.allreduce_(tensor, op=_HVD_OPS[op], process_set=_set(group))
    return None


inference_all_reduce = all_reduce


@_logged("broadcast")
def broadcast(tensor, src, group=None, async_op=False):
    if _torch(group):
        return _dist.broadcast(tensor, src, group=group, async_op=async_op)
    _hvd.broadcast_(tensor, root_rank=src, process_set=_set(group))  # src: a global rank, as torch's
    return None


@_logged("all_gather")
def all_gather(tensor_list, tensor, group=None, async_op=False):
    if _torch(group):
        return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)
    whole = _hvd.allgather(tensor.unsqueeze(0), process_set=_set(group))
    for dst, src in zip(tensor_list, whole):
        dst.copy_(src)
    return None


@_logged("all_gather_into_tensor")
def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False):
    if _torch(group):
        return _dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)
    output_tensor.copy_(_hvd.allgather(tensor.reshape(1, -1), process_set=_set(group)).reshape(output_tensor.shape))
    return None


allgather_fn = all_gather_into_tensor


@_logged("reduce_scatter_tensor")
def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False):
    if _torch(group):
        return _dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)
    output_tensor.copy_(_hvd.reducescatter(tensor.reshape(get_world_size(group), -1), op=_HVD_OPS.get(op, _hvd.Sum),
                                           process_set=_set(group)).reshape(output_tensor.shape))
    return None


@_logged("reduce")
def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    if _torch(group):
        return _dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)
    result = _hvd.allreduce(tensor, op=_HVD_OPS[op], process_set=_set(group))
    if _hvd.rank() == dst:
        tensor.copy_(result)
    return None


@_logged("all_to_all_single")
def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    if _torch(group):
        return _dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes, group=group,
                                       async_op=async_op)
    got = _hvd.alltoall(tensor, splits=input_split_sizes, process_set=_set(group))
    output.copy_((got[0] if input_split_sizes is not None else got).reshape(output.shape))
    return None


@_logged("send")
def send(tensor, dst, group=None, tag=0):
    return _dist.send(tensor, dst, group=group, tag=tag)


@_logged("recv")
def recv(tensor, src=None, group=None, tag=0):
    return _dist.recv(tensor, src=src, group=group, tag=tag)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    return _dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def destroy_process_group(group=None):
    if _torch():
        _dist.destroy_process_group(group)


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None):
    """The communication logger: from a config (its comms_logger section switches it on),
    then the arguments given, as DeepSpeed's configure."""
    if deepspeed_config is not None:
        raw = deepspeed_config if isinstance(deepspeed_config, dict) else getattr(deepspeed_config, "_param_dict", {})
        comms_logger.configure(raw.get("comms_logger"))
    for key, value in (("enabled", enabled), ("prof_all", prof_all), ("prof_ops", prof_ops), ("verbose", verbose),
                       ("debug", debug)):
        if value is not None:
            setattr(comms_logger, key, value)
    comms_logger._listen()


def start_profiling_comms():
    comms_logger.start_profiling_comms()


def stop_profiling_comms():
    comms_logger.stop_profiling_comms()


def start_profiling_op(op_name_list):
    comms_logger.start_profiling_op(op_name_list)


def stop_profiling_op(op_name_list):
    comms_logger.stop_profiling_op(op_name_list)


def log_summary(show_straggler=False, return_dict=False):
    """The communication log's summary, printed on rank 0 (every rank returns it with
    return_dict); collective, as DeepSpeed's."""
    barrier()
    result = comms_logger.log_all(print_log=get_rank() == 0, show_straggler=show_straggler, return_dict=return_dict)
    barrier()
    return result


class _Mesh:
    """DeepSpeed's (data_parallel, sequence_parallel) device mesh over chorus process sets."""

    def __init__(self, shape, names):
        self.mesh_shape, self.mesh_dim_names = tuple(shape), tuple(names)

    def get_group(self, mesh_dim):
        from chorus.deepspeed.utils import groups
        if mesh_dim == "sequence_parallel":
            return groups._get_sequence_parallel_group()
        if mesh_dim == "data_parallel":
            return groups._get_data_parallel_group()
        raise ValueError(f"device mesh: no dimension {mesh_dim!r} (it has {self.mesh_dim_names})")

    def size(self, mesh_dim=None):
        return self.mesh_shape[self.mesh_dim_names.index(mesh_dim)] if mesh_dim else self.mesh_shape[0] * \
            self.mesh_shape[1]


def initialize_mesh_device(mesh_shape, mesh_dim_names=("data_parallel", "sequence_parallel")):
    """(dp, sp): sequence-parallel sets of sp consecutive ranks, data-parallel sets across
    them (collective over every rank). Returns the mesh; get_group(mesh_dim=) gives a set."""
    from chorus.deepspeed.utils import groups
    if tuple(mesh_dim_names) != ("data_parallel", "sequence_parallel"):
        raise ValueError(f"device mesh: chorus makes ('data_parallel', 'sequence_parallel') meshes, "
                         f"not {tuple(mesh_dim_names)}")
    dp, sp = (int(v) for v in mesh_shape)
    if dp * sp != get_world_size():
        raise ValueError(f"device mesh: {dp} x {sp} = {dp * sp} ranks, the job has {get_world_size()}")
    groups._create_sequence_parallel(sp)
    return _Mesh((dp, sp), mesh_dim_names)
