"""init and ranks, with Horovod's names (horovod.common.basics; the process sets
are chorus.common.process_sets): every frontend re-exports these."""
import os
import sys

from chorus import _core
from chorus.common import process_sets as _sets
from chorus.common.process_sets import (ProcessSet, _comm_of, _get_process_set_ids_and_ranks,  # noqa: F401
                                        _initialized_sets, _known_ids, _ranks_in, _set_id, _set_of,
                                        add_process_set, global_process_set, remove_process_set)


def _nccl_folders():
    """torch's bundled NCCL (site-packages/nvidia/nccl/lib) on sys.path, where chorus
    looks for libnccl.so.2 after CHORUS_NCCL_LIBRARY."""
    found = []
    for p in sys.path:
        lib = os.path.join(p or ".", "nvidia", "nccl", "lib")
        if os.path.isfile(os.path.join(lib, "libnccl.so.2")) and lib not in found:
            found.append(lib)
    return found


_core.set_nccl_search_path(_nccl_folders())

_last_process_sets = None  # init()'s process_sets argument
_dynamic = [False]  # whether the running runtime was started with process_sets="dynamic"


def init(comm=None, process_sets=None):
    """Starts chorus on this rank (as horovod.torch.init).

    comm: None (ranks from chorusrun or mpirun), an mpi4py communicator, or a list
    of MPI_COMM_WORLD ranks to restrict chorus to. process_sets: None, a list of
    ProcessSet objects (static sets; sets built from MPI communicators may differ
    between ranks, as a Split gives each rank its own), or "dynamic" to allow
    add_process_set()/remove_process_set() at run time.

    As Horovod's: a second init() keeps the running runtime, and one with other
    process sets (collective, as the first) registers those instead. A set this
    rank sees twice, or one that is the global set, is a ValueError on this rank
    after the sets are registered: the runtime is up, and init() may be called
    again with a valid list.
    """
    dynamic = process_sets == "dynamic"
    if _core.is_initialized() and (process_sets is None or (dynamic and _dynamic[0])):
        return
    static = [] if process_sets is None or dynamic else list(process_sets)
    for ps in static:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets must hold ProcessSet objects, got {type(ps).__name__}")
    global _last_process_sets
    _last_process_sets = process_sets  # an elastic reset re-forms them (chorus.torch.elastic)
    mpi_handle = -2
    init_comm = None
    if comm is not None:
        init_comm = _comm_of(comm)
        mpi_handle = init_comm.py2f()
    given_comm = init_comm
    if any(ps._comm is not None for ps in static):
        if init_comm is None:
            from mpi4py import MPI
            init_comm = MPI.COMM_WORLD
        for ps in static:
            if ps._comm is not None:
                ps._given = _ranks_in(ps._comm, init_comm)
        # Each rank knows only the sets its own communicators describe: every
        # rank registers every rank's, the same list everywhere.
        every = init_comm.allgather([sorted(ps._given) for ps in static])
    else:
        every = [[sorted(ps._given) for ps in static]]
    rank_lists = _ordered_union(every)
    if not _core.is_initialized():
        _start(rank_lists, dynamic, mpi_handle, given_comm)
    elif _any_rank(rank_lists != _registered_static() or dynamic != _dynamic[0]):
        _core.shutdown()  # other sets than the running ones: formed again, on every rank
        _start(rank_lists, dynamic, mpi_handle, given_comm)
    global_process_set._bind(0)
    for ps in _initialized_sets:
        ps.process_set_id = None
    _initialized_sets.clear()
    for ps in static:
        ps._bind(1 + rank_lists.index(sorted(ps._given)))
        _initialized_sets.append(ps)
    _export_torch_env()
    seen = [list(range(_core.size()))]
    for ps in static:
        mine = sorted(ps._given)
        if mine in seen:
            what = "is the global set" if mine == seen[0] else "is given twice"
            raise ValueError(f"init: the process set {mine} {what} (on rank {_core.rank()}); "
                             "call init() again with each set once")
        seen.append(mine)


def _start(rank_lists, dynamic, mpi_handle, comm):
    _core.init(rank_lists, dynamic, mpi_handle)
    _sets._init_comm = comm
    global_process_set._comm = comm  # its mpi_comm, as Horovod gives it
    _dynamic[0] = dynamic or any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
                                 for k in ("CHORUS_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS"))


def _any_rank(flag):
    """Whether flag holds on any rank (collective): every rank then takes the same path."""
    from chorus.common.objects import allgather_object
    return any(allgather_object(bool(flag), name="init.process_sets.changed"))


def _ordered_union(every):
    """Each rank's lists merged position by position: the sets the ranks give first
    get the first ids (among them, ordered by their ranks), each set once."""
    out = []
    for i in range(max((len(lists) for lists in every), default=0)):
        for ranks in sorted({tuple(lists[i]) for lists in every if i < len(lists)}):
            if list(ranks) not in out:
                out.append(list(ranks))
    return out


def _registered_static():
    """The registered sets but the global one, by id, each as sorted ranks."""
    return [sorted(r) for i, r in sorted(_get_process_set_ids_and_ranks().items()) if i != 0]


def _export_torch_env():
    """torch.distributed's env:// variables, so that init_process_group() works
    beside chorus under any launcher. An elastic round replaces them; otherwise
    what the launcher set stays."""
    import os
    addr, port = _core.torch_master()
    values = {"MASTER_ADDR": addr, "MASTER_PORT": str(port), "RANK": str(_core.rank()),
              "WORLD_SIZE": str(_core.size()), "LOCAL_RANK": str(_core.local_rank()),
              "LOCAL_WORLD_SIZE": str(_core.local_size()), "LOCAL_SIZE": str(_core.local_size()),
              "CROSS_RANK": str(_core.cross_rank()), "CROSS_SIZE": str(_core.cross_size())}
    replace = bool(os.environ.get("CHORUS_ELASTIC_WORKER"))
    for key, value in values.items():
        if replace or key not in os.environ:
            os.environ[key] = value


def shutdown():
    _core.shutdown()
    for ps in _initialized_sets:
        ps.process_set_id = None
    _initialized_sets.clear()


def is_initialized():
    return _core.is_initialized()


def start_timeline(file_path, mark_cycles=False):
    """Rank 0 records a Chrome trace of every tensor's negotiation and execution
    into file_path (moved into place by stop_timeline() or shutdown())."""
    _core.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline():
    _core.stop_timeline()


rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size
is_homogeneous = _core.is_homogeneous


def mpi_threads_supported():
    """Whether the MPI job chorus joined runs at MPI_THREAD_MULTIPLE (False without MPI)."""
    if not _core.is_initialized():
        raise ValueError("chorus has not been initialized; use hvd.init()")
    return _core.mpi_threads_supported()


def mpi_enabled():
    """Whether this job runs in an MPI world (started by mpirun or given a communicator)."""
    return _core.mpi_enabled()


def gloo_enabled():
    """Whether chorus's own TCP controller negotiates, the part Horovod's Gloo mode plays."""
    return _core.gloo_enabled()


# What this build has: its wire backends (chorus's TCP transport in Gloo's
# place, MPI), its CUDA backend and NCCL (opened at run time); no ROCm, DDL or oneCCL.
def mpi_built(verbose=False):
    return _core.mpi_built()


def gloo_built(verbose=False):
    return True


def nccl_built(verbose=False):
    """NCCL's version code (e.g. 22809) when chorus can open NCCL, else 0, as Horovod's."""
    return _core.nccl_built()


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    """Whether chorus's CUDA backend (libchorus_cuda) was built and opens."""
    return _core.cuda_built()


def rocm_built(verbose=False):
    return False


def stats(process_set=None):
    """This rank's counters of a process set (the global one by default): cycles,
    ops negotiated and cached, fused allreduces, the fusion threshold and cycle
    time in force, and for CUDA tensors the set's path ("NCCL" or "STAGED") and why."""
    return _core.process_set_stats(_set_id(process_set))
