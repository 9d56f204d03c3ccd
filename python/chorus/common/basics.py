"""init, ranks and process sets, with Horovod's names (horovod.common.basics and
process_sets): every frontend re-exports these."""
import os
import sys

from chorus import _core


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

_initialized_sets = []  # ProcessSet objects registered at init or added later
_init_comm = None  # the mpi4py communicator init() was given, if any
_last_process_sets = None  # init()'s process_sets argument


class ProcessSet:
    """A subset of the ranks that runs its own collectives.

    Build one from a list of global ranks, or from an MPI communicator (mpi4py),
    before init() and pass it to init(process_sets=[...]), or add it at run time
    with add_process_set().
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self._comm = None
        if _is_mpi_comm(ranks_or_comm):
            self._comm = ranks_or_comm
            self.ranks = []
            self._given = []
            return
        ranks = [int(r) for r in ranks_or_comm]
        self.ranks = sorted(ranks)
        self._given = ranks

    def _bind(self, set_id):
        self.process_set_id = set_id
        self.ranks = list(_core.process_set_ranks(set_id))

    @property
    def mpi_comm(self):
        """The mpi4py communicator the set was made from (None for a list of ranks)."""
        return self._comm

    def _require_registered(self):
        if self.process_set_id is None:
            raise ValueError(
                f"process set {self.ranks} is not registered: pass it to init(process_sets=[...]) "
                "or add it with add_process_set()")

    def included(self):
        """Whether this process is a member."""
        self._require_registered()
        return _core.rank() in self.ranks

    def rank(self):
        """This process's rank within the set, or -1 when not a member."""
        self._require_registered()
        r = _core.rank()
        return self.ranks.index(r) if r in self.ranks else -1

    def size(self):
        self._require_registered()
        return len(self.ranks)

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id and \
            self.ranks == other.ranks

    def __hash__(self):
        return hash((self.process_set_id, tuple(self.ranks)))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _is_mpi_comm(obj):
    return hasattr(obj, "py2f") and hasattr(obj, "Get_group")


def _ranks_in(comm, init_comm):
    """The ranks, relative to init_comm, of comm's members."""
    from mpi4py import MPI
    return sorted(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                            init_comm.Get_group()))


def _comm_of(comm):
    """init's comm: an mpi4py communicator, or a list of MPI_COMM_WORLD ranks (as Horovod takes)."""
    if _is_mpi_comm(comm):
        return comm
    from mpi4py import MPI
    ranks = [int(r) for r in comm]
    world = MPI.COMM_WORLD
    sub = world.Create_group(world.Get_group().Incl(ranks))
    if sub == MPI.COMM_NULL:
        raise ValueError(f"this process (MPI_COMM_WORLD rank {world.rank}) is not in init's comm {ranks}")
    return sub


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def init(comm=None, process_sets=None):
    """Starts chorus on this rank (as horovod.torch.init).

    comm: None (ranks from chorusrun or mpirun), an mpi4py communicator, or a list
    of MPI_COMM_WORLD ranks to restrict chorus to. process_sets: None, a list of
    ProcessSet objects (static sets; sets built from MPI communicators may differ
    between ranks, as a Split gives each rank its own), or "dynamic" to allow
    add_process_set()/remove_process_set() at run time.
    """
    if _core.is_initialized():
        return  # as Horovod's: a second init() keeps the running runtime
    dynamic = False
    static = []
    if process_sets == "dynamic":
        dynamic = True
    elif process_sets is not None:
        static = list(process_sets)
        for ps in static:
            if not isinstance(ps, ProcessSet):
                raise ValueError(f"process_sets must hold ProcessSet objects, got {type(ps).__name__}")
    global _init_comm, _last_process_sets
    _last_process_sets = process_sets  # an elastic reset re-forms them (chorus.torch.elastic)
    mpi_handle = -2
    init_comm = None
    if comm is not None:
        init_comm = _comm_of(comm)
        mpi_handle = init_comm.py2f()
    _init_comm = init_comm
    if any(ps._comm is not None for ps in static):
        if init_comm is None:
            from mpi4py import MPI
            init_comm = MPI.COMM_WORLD
        for ps in static:
            if ps._comm is not None:
                ps._given = _ranks_in(ps._comm, init_comm)
        # Each rank knows only the sets its own communicators describe: register
        # the union, the same on every rank.
        every = init_comm.allgather([sorted(ps._given) for ps in static])
        union = sorted({tuple(r) for lists in every for r in lists})
        rank_lists = [list(r) for r in union]
    else:
        rank_lists = [ps._given for ps in static]
    seen = set()
    for ranks in rank_lists:  # as Horovod: one set per list of ranks
        key = tuple(sorted(ranks))
        if key in seen:
            raise ValueError(f"init: the process set {sorted(ranks)} is given twice")
        seen.add(key)
    _core.init(rank_lists, dynamic, mpi_handle)
    global_process_set._bind(0)
    _initialized_sets.clear()
    for ps in static:
        ps._bind(1 + [sorted(r) for r in rank_lists].index(sorted(ps._given)))
        _initialized_sets.append(ps)
    _export_torch_env()


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


def add_process_set(process_set):
    """Adds a process set at run time; collective over all ranks (init(process_sets="dynamic")).

    From an MPI communicator, each rank may describe a different set (a Split):
    every described set is added, the same on every rank, and this rank's object
    is bound to its own."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    if ps._comm is not None:
        from chorus.common.objects import allgather_object
        from mpi4py import MPI
        mine = _ranks_in(ps._comm, _init_comm or MPI.COMM_WORLD)
        added = []
        for ranks in sorted({tuple(r) for r in allgather_object(mine, name="add_process_set")}):
            target = ps if list(ranks) == mine else ProcessSet(list(ranks))
            target._given = list(ranks)
            target._bind(_core.add_process_set(list(ranks)))
            _initialized_sets.append(target)
            added.append(target)
        for target in added:  # removed together, as they were added
            target._siblings = added
        return ps
    existing = [sorted(other._given) for other in _initialized_sets if other.process_set_id is not None]
    existing.append(list(range(_core.size())))  # the global set
    if sorted(ps._given) in existing:
        raise ValueError(f"add_process_set: a process set with ranks {sorted(ps._given)} exists already")
    ps._bind(_core.add_process_set(ps._given))
    _initialized_sets.append(ps)
    return ps


def remove_process_set(process_set):
    """Removes a process set added at run time; collective over all ranks. Returns True.

    A set added from an MPI communicator is removed with the sets the other ranks'
    communicators described in the same add_process_set call."""
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered")
    # Sets added from one MPI communicator differ between ranks; all of them go.
    for ps in getattr(process_set, "_siblings", [process_set]):
        _core.remove_process_set(ps.process_set_id)
        ps.process_set_id = None
        if ps in _initialized_sets:
            _initialized_sets.remove(ps)
    return True


def _set_id(process_set):
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    process_set._require_registered()
    pid = process_set.process_set_id
    if pid != 0 and pid not in _known_ids and _core.is_initialized():
        _known_ids.clear()  # sets came or went since: ask the core once
        _known_ids.update(_core.process_set_ids())
        if pid not in _known_ids:
            raise ValueError(f"process set id {pid} is not a registered process set "
                             f"(registered: {sorted(_known_ids)})")
    return pid


_known_ids = set()  # the registered process set ids last seen (_set_id's cache)


def _set_of(set_id):
    """The registered ProcessSet with this id (the inverse of _set_id)."""
    if set_id == 0:
        return global_process_set
    for ps in _initialized_sets:
        if ps.process_set_id == set_id:
            return ps
    raise ValueError(f"process set {set_id} is not registered")


def stats(process_set=None):
    """This rank's counters of a process set (the global one by default): cycles,
    ops negotiated and cached, fused allreduces, the fusion threshold and cycle
    time in force, and for CUDA tensors the set's path ("NCCL" or "STAGED") and why."""
    return _core.process_set_stats(_set_id(process_set))
