"""DeepSpeed-compatible training on chorus: ``import chorus.deepspeed as deepspeed``.

ZeRO stages 0-3, fp16/bf16 with dynamic loss scaling, gradient accumulation, CPU
offload with chorus's SIMD CPU Adam, and sharded checkpoints. The engine's core
(partitioning, collectives, optimizer) is C++; this package hooks it into torch.
"""
import os as _os

import chorus.torch as _hvd
from chorus.deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: F401  (deepspeed.checkpointing)
from chorus.deepspeed import (accelerator, checkpoint, comm, moe, ops, pipe, runtime, sequence, utils,  # noqa: F401
                              zero)
from chorus.deepspeed.runtime import config as _config
from chorus.deepspeed import elastic  # noqa: F401  (deepspeed.elastic.DeepSpeedState)
from chorus.deepspeed.runtime.engine import DeepSpeedEngine
from chorus.deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

from chorus.deepspeed._version import DEEPSPEED_API_VERSION as __version__  # the DeepSpeed API implemented

__chorus_version__ = "0.1.0"


def _export_world_env():
    """DeepSpeed programs read WORLD_SIZE / RANK / LOCAL_RANK before initialize();
    fill them from chorusrun's or mpirun's variables when the launcher did not."""
    sources = {"WORLD_SIZE": ("CHORUS_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
               "RANK": ("CHORUS_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
               "LOCAL_RANK": ("CHORUS_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")}
    for key, names in sources.items():
        if key not in _os.environ:
            for name in names:
                if name in _os.environ:
                    _os.environ[key] = _os.environ[name]
                    break


_export_world_env()
__all__ = ["initialize", "init_distributed", "add_config_arguments", "DeepSpeedEngine", "WarmupLR", "WarmupDecayLR",
           "set_gradient_priority"]


def set_gradient_priority(modules_or_params, priority):
    """Gives these parameters' gradient collectives a priority (higher goes first
    among those ready together, as hvd.allreduce(priority=) does, and between the
    chunks of a large one in flight), e.g. the first layers', whose updated
    weights the next forward pass needs first. priority="layer_order" gives the
    parameters in the order listed (model.parameters(): first layers first)
    descending priorities. Call it before initialize()."""
    items = modules_or_params if isinstance(modules_or_params, (list, tuple)) else [modules_or_params]
    params = [p for item in items for p in (item.parameters() if hasattr(item, "parameters") else [item])]
    if priority == "layer_order":
        for i, p in enumerate(params):
            p.chorus_priority = len(params) - i
        return
    if isinstance(priority, str):
        raise ValueError(f"set_gradient_priority: priority must be an int or 'layer_order', not {priority!r}")
    for p in params:
        p.chorus_priority = int(priority)


init_distributed = comm.init_distributed


def add_config_arguments(parser):
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="enable DeepSpeed")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    return parser


def _sequence_mesh(mesh_param, config):
    """The (dp, sp) mesh's sets, when asked for (collective over every rank)."""
    if mesh_param is None and config and "sequence_parallel_size" in config and "data_parallel_size" in config:
        mesh_param = (config["data_parallel_size"], config["sequence_parallel_size"])
    if mesh_param is None:
        return
    dp, sp = (int(v) for v in mesh_param)
    if dp * sp != _hvd.size():
        raise ValueError(f"deepspeed.initialize: mesh (data parallel {dp}) x (sequence parallel {sp}) = {dp * sp} "
                         f"ranks, the job has {_hvd.size()}")
    comm.initialize_mesh_device((dp, sp))


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               config_params=None, process_set=None, mesh_param=None):
    """Returns (engine, optimizer, training_dataloader, lr_scheduler) as DeepSpeed does.
    process_set: the data-parallel chorus ProcessSet (default: every rank).
    mesh_param=(dp, sp) (or the config's data_parallel_size and sequence_parallel_size):
    DeepSpeed's device mesh, sequence-parallel sets of sp consecutive ranks."""
    if model is None:
        raise ValueError("deepspeed.initialize: model is required")
    if not _hvd.is_initialized():
        _hvd.init(process_sets="dynamic")
    _sequence_mesh(mesh_param, config if isinstance(config, dict) else None)
    if _os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        # Under torchrun (Spark's TorchDistributor starts it) DeepSpeed's initialize
        # starts torch.distributed too, and programs rely on it (dist.get_rank()).
        comm.init_distributed(dist_init_required=dist_init_required)
    pipe_set, tp = None, 1
    if mpu is not None:  # ZeRO over the data-parallel set; the norm over the tensor-parallel one
        utils.groups.mpu = mpu  # as DeepSpeed's: its groups answer from the mpu
        from chorus.torch import ProcessSet
        dp_group = mpu.get_data_parallel_group()
        tp_group = mpu.get_model_parallel_group()
        for what, group in (("data", dp_group), ("model", tp_group)):
            if group is not None and not isinstance(group, ProcessSet):
                raise ValueError(f"deepspeed.initialize: mpu.get_{what}_parallel_group() returned "
                                 f"{type(group).__name__}; chorus needs its process sets (chorus.parallel.mpu)")
        if process_set is not None and process_set is not dp_group:
            raise ValueError("deepspeed.initialize: give process_set or mpu, not both")
        process_set, pipe_set, tp = dp_group, tp_group, mpu.get_model_parallel_world_size()
    text = _config.load_config(config, config_params, args)
    import json as _json
    if "activation_checkpointing" in _json.loads(text):
        from chorus.deepspeed.runtime.activation_checkpointing import checkpointing
        checkpointing.configure(mpu, deepspeed_config=_json.loads(text))
    if isinstance(model, pipe.PipelineModule):
        from chorus.deepspeed.runtime.pipe.engine import PipelineEngine
        engine = PipelineEngine(model, optimizer, model_parameters, text,
                                lr_scheduler if not callable(lr_scheduler) or hasattr(lr_scheduler, "step") else None)
        if training_data is not None:
            engine.training_dataloader = engine.engine.deepspeed_io(training_data, collate_fn=collate_fn)
            engine.set_dataiterator(iter(engine.training_dataloader))
        return engine, engine.optimizer, getattr(engine, "training_dataloader", None), engine.lr_scheduler
    engine = DeepSpeedEngine(model, optimizer, model_parameters, text, process_set,
                             lr_scheduler if not callable(lr_scheduler) or hasattr(lr_scheduler, "step") else None,
                             pipe_set=pipe_set if tp > 1 else None, tensor_parallel_size=tp,
                             model_parallel_rank=mpu.get_model_parallel_rank() if tp > 1 else 0,
                             tensor_parallel_set=pipe_set)
    if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        engine.lr_scheduler = lr_scheduler(engine.basic_optimizer)  # as DeepSpeed: its torch optimizer
    loader = engine.deepspeed_io(training_data, collate_fn=collate_fn) if training_data is not None else None
    engine.training_dataloader = loader
    # No optimizer given or configured: DeepSpeed's initialize returns None in its place.
    return engine, engine.optimizer if engine._has_optimizer else None, loader, engine.lr_scheduler
