"""The model-parallel unit (``mpu``) DeepSpeed and Megatron expect, over chorus
process sets: tensor (model) parallel groups of neighbouring ranks, pipeline
stages, and data-parallel replicas. Layout as DeepSpeed's
PipeModelDataParallelTopology: rank = (pipe * data_size + data) * tensor_size + tensor."""
import chorus.torch as hvd
from chorus.deepspeed.runtime.pipe.topology import Grid, PipeModelDataParallelTopology

_grid = None


def initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, topology=None):
    """Carves the job into data x pipeline x tensor groups (collective). The product of
    the sizes must divide the world size; the data-parallel size is what is left."""
    global _grid
    if not hvd.is_initialized():
        from chorus.deepspeed import init_distributed
        init_distributed()
    world = hvd.size()
    if topology is None:
        tp, pp = int(tensor_model_parallel_size), int(pipeline_model_parallel_size)
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ValueError(f"initialize_model_parallel: tensor size {tp} x pipeline size {pp} does not divide "
                             f"the world size {world}")
        topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (tp * pp))
    _grid = Grid(topology)
    return _grid


def model_parallel_is_initialized():
    return _grid is not None


def _require():
    if _grid is None:
        raise RuntimeError("chorus.parallel.mpu: call initialize_model_parallel() first")
    return _grid


def destroy_model_parallel():
    global _grid
    _grid = None


def get_topology():
    return _require().topology


def get_model_parallel_group():
    """The tensor-parallel process set of this rank (None: tensor size 1)."""
    return _require().sets.get("model")


def get_model_parallel_world_size():
    return _require().size("model")


def get_model_parallel_rank():
    return _require().index("model")


def get_data_parallel_group():
    return _require().sets["data"]


def get_data_parallel_world_size():
    return _require().size("data")


def get_data_parallel_rank():
    return _require().index("data")


def get_pipe_parallel_group():
    return _require().sets.get("pipe")


def get_pipe_parallel_world_size():
    return _require().size("pipe")


def get_pipe_parallel_rank():
    return _require().index("pipe")


def get_model_parallel_src_rank():
    """The global rank of tensor-parallel rank 0 in this rank's group."""
    g = _require()
    return g.topology.get_rank(**dict(g.coord._asdict(), model=0))


# Megatron's newer names.
get_tensor_model_parallel_group = get_model_parallel_group
get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank
get_tensor_model_parallel_src_rank = get_model_parallel_src_rank
get_pipeline_model_parallel_group = get_pipe_parallel_group
get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
get_pipeline_model_parallel_rank = get_pipe_parallel_rank
