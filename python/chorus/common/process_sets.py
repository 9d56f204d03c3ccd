"""Process sets (horovod.common.process_sets): subsets of the ranks that run
their own collectives, registered at init or added and removed at run time."""
from chorus import _core

_initialized_sets = []  # ProcessSet objects registered at init or added later
_init_comm = None  # the mpi4py communicator init() was given, if any


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
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self._comm})"


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
    """Removes a process set added at run time; collective over all ranks. Returns True
    (False for the global set, which cannot be removed).

    A set added from an MPI communicator is removed with the sets the other ranks'
    communicators described in the same add_process_set call."""
    if process_set.process_set_id == 0:
        return False  # the global set stays, as Horovod's returns False for it
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


def _get_process_set_ids_and_ranks():
    """{process set id: its global ranks} of every registered set (Horovod's basics call)."""
    return {int(i): list(_core.process_set_ranks(i)) for i in _core.process_set_ids()}
