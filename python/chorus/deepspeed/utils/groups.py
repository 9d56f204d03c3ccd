"""deepspeed.utils.groups: the data-, expert- and sequence-parallel groups, as
chorus process sets (made collectively: every rank makes every group in the same
order, so the sets stay in step).

With ep_size E over W ranks (DeepSpeed's "E + D" layout): the expert-parallel sets
are runs of E consecutive ranks ([0,1],[2,3] at W=4, E=2); each holds every expert
once, and MoE layers' all-to-alls run there. The expert-data-parallel sets take
one rank from each run ([0,2],[1,3]): the ranks that hold the same experts, whose
gradients are reduced there. With use_data_before_expert_parallel_ ("D + E") the
two are swapped. Sequence parallelism (Ulysses) at size P: the sequence-parallel
sets are runs of P consecutive ranks, the data-parallel sets one rank of each run;
ZeRO and the gradient reduction run over all of them together (every rank)."""
import chorus.torch as _hvd

mpu = None  # DeepSpeed's: the model-parallel unit deepspeed.initialize(mpu=) was given
expert_tensor_parallel_world_size = 1

_EXPERT_PARALLEL_GROUP = {}
_EXPERT_PARALLEL_GROUP_RANKS = {}
_EXPERT_DATA_PARALLEL_GROUP = {}
_EXPERT_DATA_PARALLEL_GROUP_RANKS = {}
_EXPERT_LAYOUT = {}  # group name: use_data_before_expert_parallel_ it was made with
_EXPERT_SLICED = {}  # group name: whether its experts are tensor-parallel slices
_SEQUENCE_PARALLEL = {}  # "group", "ranks", "data_group", "data_ranks" once made


def _world():
    if not _hvd.is_initialized():
        raise RuntimeError("deepspeed.utils.groups: chorus is not initialized; call deepspeed.init_distributed() first")
    return _hvd.size()


def _process_set(ranks):
    from chorus.deepspeed.runtime.pipe.topology import process_set_for
    return process_set_for(list(ranks))


def _ensure_divisibility(numerator, denominator, what):
    if denominator <= 0 or numerator % denominator != 0:
        raise ValueError(f"{what}: {numerator} is not divisible by {denominator}")


def _expert_layout(world, ep_size, use_data_before_expert_parallel_=False):
    """(expert-parallel sets, expert-data-parallel sets) as lists of global ranks."""
    if ep_size < 1 or world % ep_size != 0:
        raise ValueError(f"expert parallelism: ep_size {ep_size} does not divide the world size {world}")
    edp = world // ep_size
    if use_data_before_expert_parallel_:
        data = [list(range(i * edp, (i + 1) * edp)) for i in range(ep_size)]
        expert = [list(range(j, world, edp)) for j in range(edp)]
    else:
        expert = [list(range(i * ep_size, (i + 1) * ep_size)) for i in range(edp)]
        data = [list(range(j, world, ep_size)) for j in range(ep_size)]
    return expert, data


def _create_expert_and_data_parallel(expert_parallel_size_, use_data_before_expert_parallel_=False, **_ignored):
    """Makes the ep_size_<E> expert- and expert-data-parallel sets (once per size).
    Collective over every rank."""
    world = _world()
    name = f"ep_size_{expert_parallel_size_}"
    if name in _EXPERT_PARALLEL_GROUP:
        return
    expert, data = _expert_layout(world, expert_parallel_size_, use_data_before_expert_parallel_)
    _EXPERT_SLICED[name] = False
    _make_expert_sets(name, expert, data, use_data_before_expert_parallel_)


def _expert_layout_tp(world, tp, ep_size, use_data_before_expert_parallel_=False):
    """Experts sliced by tensor parallelism (tp consecutive ranks per slice group): the
    expert-parallel sets are runs of ep_size ranks of one data-parallel set (one slice),
    the expert-data-parallel sets the ranks of that set holding the same experts."""
    if tp < 1 or world % tp:
        raise ValueError(f"expert tensor parallelism: tensor-parallel size {tp} does not divide the world {world}")
    dp = world // tp
    if ep_size < 1 or dp % ep_size:
        raise ValueError(f"expert tensor parallelism: ep_size {ep_size} does not divide the data-parallel size {dp}")
    if use_data_before_expert_parallel_:  # each slice's ranks, ordered so that runs of ep_size are strided
        stride = dp // ep_size
        data_sets = [[r for d in range(stride) for r in range(i + d * tp, world, stride * tp)] for i in range(tp)]
    else:
        data_sets = [list(range(i, world, tp)) for i in range(tp)]
    expert, data = [], []
    for ranks in data_sets:
        runs = [ranks[k:k + ep_size] for k in range(0, dp, ep_size)]
        expert += runs
        data += [[run[j] for run in runs] for j in range(ep_size)]
    return expert, data


def _create_expert_data_and_model_parallel(expert_parallel_size_, mpu, use_data_before_expert_parallel_=False):
    """The ep_size_<E> sets when the experts themselves are tensor-parallel (the MoE
    layer's enable_expert_tensor_parallelism under an mpu). Collective over every rank."""
    global expert_tensor_parallel_world_size
    world = _world()
    tp = mpu.get_model_parallel_world_size()
    me = _hvd.rank()
    mine = sorted(mpu.get_model_parallel_group().ranks)
    if mine != list(range(me - me % tp, me - me % tp + tp)):
        raise ValueError(f"expert tensor parallelism: the tensor-parallel groups must be runs of {tp} consecutive "
                         f"ranks (Megatron's layout); rank {me}'s is {mine}")
    expert_tensor_parallel_world_size = tp
    name = f"ep_size_{expert_parallel_size_}"
    if name in _EXPERT_PARALLEL_GROUP:
        return
    expert, data = _expert_layout_tp(world, tp, expert_parallel_size_, use_data_before_expert_parallel_)
    _EXPERT_SLICED[name] = True
    _make_expert_sets(name, expert, data, use_data_before_expert_parallel_)


def _make_expert_sets(name, expert, data, use_data_before_expert_parallel_):
    _EXPERT_LAYOUT[name] = bool(use_data_before_expert_parallel_)
    me = _hvd.rank()
    for ranks in data:
        ps = _process_set(ranks)
        if me in ranks:
            _EXPERT_DATA_PARALLEL_GROUP[name], _EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = ps, ranks
    for ranks in expert:
        ps = _process_set(ranks)
        if me in ranks:
            _EXPERT_PARALLEL_GROUP[name], _EXPERT_PARALLEL_GROUP_RANKS[name] = ps, ranks


def _require(table, name, what):
    if name not in table:
        raise KeyError(f"{what} group '{name}' is not initialized (made by the MoE layer or deepspeed.initialize)")
    return table[name]


def _get_expert_parallel_group(group_name):
    return _require(_EXPERT_PARALLEL_GROUP, group_name, "expert parallel")


def _get_expert_parallel_group_ranks(group_name):
    return _require(_EXPERT_PARALLEL_GROUP_RANKS, group_name, "expert parallel")


def _get_expert_parallel_group_dict():
    return _EXPERT_PARALLEL_GROUP


def _get_expert_data_parallel_group(group_name):
    return _require(_EXPERT_DATA_PARALLEL_GROUP, group_name, "expert data parallel")


def _get_expert_data_parallel_group_ranks(group_name):
    return _require(_EXPERT_DATA_PARALLEL_GROUP_RANKS, group_name, "expert data parallel")


def _get_expert_data_parallel_group_dict():
    return _EXPERT_DATA_PARALLEL_GROUP


def _get_expert_parallel_world_size(group_name):
    return len(_get_expert_parallel_group_ranks(group_name))


def _get_expert_parallel_rank(group_name):
    return _get_expert_parallel_group_ranks(group_name).index(_hvd.rank())


def _get_expert_parallel_src_rank(group_name):
    return _get_expert_parallel_group_ranks(group_name)[0]


def _get_expert_data_parallel_world_size(group_name):
    return len(_get_expert_data_parallel_group_ranks(group_name))


def _get_expert_data_parallel_rank(group_name):
    return _get_expert_data_parallel_group_ranks(group_name).index(_hvd.rank())


def _get_expert_broadcast_src_rank(group_name):
    return _get_expert_data_parallel_group_ranks(group_name)[0]


def _get_max_expert_size():
    sizes = [int(k.split("_")[2]) for k in _EXPERT_PARALLEL_GROUP]
    return max(sizes) if sizes else None


def _get_max_expert_size_name():
    return f"ep_size_{_get_max_expert_size()}"


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def _get_expert_model_parallel_world_size():
    return expert_tensor_parallel_world_size


# --- data and sequence parallelism ---------------------------------------------------------
def _get_data_parallel_world_size():
    if mpu is not None:
        return mpu.get_data_parallel_world_size()
    if _SEQUENCE_PARALLEL:
        return len(_SEQUENCE_PARALLEL["data_ranks"])
    return _hvd.size() if _hvd.is_initialized() else 1


def _get_data_parallel_rank():
    if mpu is not None:
        return mpu.get_data_parallel_rank()
    if _SEQUENCE_PARALLEL:
        return _SEQUENCE_PARALLEL["data_ranks"].index(_hvd.rank())
    return _hvd.rank() if _hvd.is_initialized() else 0


def _get_data_parallel_group():
    if mpu is not None:
        return mpu.get_data_parallel_group()
    if _SEQUENCE_PARALLEL:
        return _SEQUENCE_PARALLEL["data_group"]
    return _hvd.global_process_set


def _get_model_parallel_world_size():
    return 1 if mpu is None or not hasattr(mpu, "get_model_parallel_world_size") else \
        mpu.get_model_parallel_world_size()


def _create_sequence_parallel(sequence_parallel_size):
    """Makes the sequence-parallel sets (runs of P consecutive ranks) and the
    data-parallel sets across them, as DeepSpeed's (dp, sp) device mesh. Collective."""
    world = _world()
    p = int(sequence_parallel_size)
    if p < 1 or world % p != 0:
        raise ValueError(f"sequence parallelism: sequence_parallel_size {p} does not divide the world size {world}")
    if _SEQUENCE_PARALLEL:
        if len(_SEQUENCE_PARALLEL["ranks"]) != p:
            raise ValueError(f"sequence parallelism: already made at size {len(_SEQUENCE_PARALLEL['ranks'])}, "
                             f"asked for {p}")
        return
    me = _hvd.rank()
    found = {}
    for ranks in [list(range(i, i + p)) for i in range(0, world, p)]:
        ps = _process_set(ranks)  # (a one-rank set at p=1: its size and rank answer as the group's)
        if me in ranks:
            found["group"], found["ranks"] = ps, ranks
    for ranks in [list(range(j, world, p)) for j in range(p)]:
        ps = _process_set(ranks)
        if me in ranks:
            found["data_group"], found["data_ranks"] = ps, ranks
    _SEQUENCE_PARALLEL.update(found)


def _get_sequence_parallel_world_size():
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_world_size"):
        return mpu.get_sequence_parallel_world_size()
    return len(_SEQUENCE_PARALLEL["ranks"]) if _SEQUENCE_PARALLEL else 1


def _get_sequence_parallel_rank():
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_rank"):
        return mpu.get_sequence_parallel_rank()
    return _SEQUENCE_PARALLEL["ranks"].index(_hvd.rank()) if _SEQUENCE_PARALLEL else 0


def _get_sequence_parallel_group():
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_group"):
        return mpu.get_sequence_parallel_group()
    if not _SEQUENCE_PARALLEL:
        raise KeyError("No sequence parallel group found")
    return _SEQUENCE_PARALLEL["group"]


def _get_sequence_data_parallel_world_size():
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_world_size"):
        return mpu.get_sequence_data_parallel_world_size()
    return _hvd.size() if _hvd.is_initialized() else 1


def _get_sequence_data_parallel_rank():
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_rank"):
        return mpu.get_sequence_data_parallel_rank()
    return _hvd.rank() if _hvd.is_initialized() else 0


def _get_sequence_data_parallel_group():
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_group"):
        return mpu.get_sequence_data_parallel_group()
    if _SEQUENCE_PARALLEL or mpu is None:
        return _hvd.global_process_set
    return _get_data_parallel_group()


def _reset():
    """Forgets every group (an elastic reset re-forms the world; the sets are gone)."""
    global mpu, expert_tensor_parallel_world_size
    mpu = None
    expert_tensor_parallel_world_size = 1
    for table in (_EXPERT_PARALLEL_GROUP, _EXPERT_PARALLEL_GROUP_RANKS, _EXPERT_DATA_PARALLEL_GROUP,
                  _EXPERT_DATA_PARALLEL_GROUP_RANKS, _EXPERT_LAYOUT, _EXPERT_SLICED, _SEQUENCE_PARALLEL):
        table.clear()
