"""Rank layouts over named axes (DeepSpeed's ProcessTopology): ranks are numbered
row-major over the axes, so the last axis varies fastest. Each axis's groups (the
ranks that differ only along it) become chorus process sets."""
import itertools
from collections import namedtuple

import chorus.torch as hvd


class ProcessTopology:
    def __init__(self, axes, dims):
        if len(axes) != len(dims) or any(d < 1 for d in dims):
            raise ValueError(f"ProcessTopology: axes {axes} and dims {dims} do not match")
        self.axes, self.dims = list(axes), list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        self.mapping = {}
        for rank, coord in enumerate(itertools.product(*[range(d) for d in self.dims])):
            self.mapping[self.ProcessCoord(*coord)] = rank
        self._coords = {r: c for c, r in self.mapping.items()}

    def world_size(self):
        return len(self.mapping)

    def get_dim(self, axis):
        return self.dims[self.axes.index(axis)] if axis in self.axes else 1

    def get_coord(self, rank):
        if rank not in self._coords:
            raise ValueError(f"ProcessTopology: rank {rank} is not in a topology of {self.world_size()} ranks")
        return self._coords[rank]

    def get_rank(self, **coords):
        if set(coords) != set(self.axes):
            raise ValueError(f"ProcessTopology.get_rank needs every axis of {self.axes}, got {sorted(coords)}")
        return self.mapping[self.ProcessCoord(**coords)]

    def get_axis_names(self):
        return list(self.axes)

    def filter_match(self, **filters):
        return sorted(r for c, r in self.mapping.items() if all(getattr(c, k) == v for k, v in filters.items()))

    def get_axis_list(self, axis, idx):
        return self.filter_match(**{axis: idx})

    def get_axis_comm_lists(self, axis):
        """The groups of ranks that differ only along axis, each sorted."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        groups = []
        for fixed in itertools.product(*[range(self.get_dim(a)) for a in others]):
            groups.append(self.filter_match(**dict(zip(others, fixed))))
        return groups

    def __str__(self):
        return f"ProcessTopology({dict(zip(self.axes, self.dims))})"


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline stages x data-parallel replicas; the replicas of a stage are neighbours."""

    def __init__(self, num_pp, num_dp):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline x data x tensor (model) parallel; tensor-parallel ranks are neighbours."""

    def __init__(self, num_pp, num_mp, num_dp):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


def process_set_for(ranks):
    """A process set over ranks: the global set, one already registered, or a new
    one. Collective: every rank calls it with the same ranks, in the same order.
    Needs dynamic process sets (chorus.deepspeed.init_distributed turns them on)."""
    ranks = sorted(ranks)
    if ranks == list(range(hvd.size())):
        return hvd.global_process_set
    from chorus.common import process_sets
    for ps in process_sets._initialized_sets:
        if ps.process_set_id is not None and sorted(ps.ranks) == ranks:
            return ps
    try:
        return hvd.add_process_set(ranks)
    except ValueError as e:
        raise ValueError(f"{e}; a pipeline or tensor-parallel layout adds process sets at run time: "
                         f"initialize with chorus.deepspeed.init_distributed() or "
                         f"hvd.init(process_sets=\"dynamic\")") from e


class Grid:
    """This rank's groups in a topology, as chorus process sets (made collectively:
    every rank makes every axis's sets in the same order)."""

    def __init__(self, topology):
        self.topology = topology
        self.rank = hvd.rank()
        if topology.world_size() != hvd.size():
            raise ValueError(f"{topology} has {topology.world_size()} ranks; the job has {hvd.size()}")
        self.coord = topology.get_coord(self.rank)
        self.sets = {}
        for axis in topology.get_axis_names():
            for group in topology.get_axis_comm_lists(axis):
                # A one-rank group has nothing to talk to, except the data axis: a
                # ZeRO engine runs over it whatever its size.
                ps = process_set_for(group) if len(group) > 1 or axis == "data" else None
                if self.rank in group:
                    self.sets[axis] = ps
        # The ranks of one model replica: every rank with this data coordinate.
        if "data" in topology.get_axis_names() and len(topology.get_axis_names()) > 1:
            replica = [topology.filter_match(data=d) for d in range(topology.get_dim("data"))]
            for group in replica:
                ps = process_set_for(group) if len(group) > 1 else None
                if self.rank in group:
                    self.sets["replica"] = ps

    def size(self, axis):
        return self.topology.get_dim(axis)

    def index(self, axis):
        return getattr(self.coord, axis) if axis in self.topology.get_axis_names() else 0
