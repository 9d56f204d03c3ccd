"""chorus.deepspeed has one layout: DeepSpeed's module paths, each holding chorus's
implementation (a client importing deepspeed.runtime.engine gets the class defined
there, not a re-export of a second tree), and the public short names (deepspeed.zero,
deepspeed.pipe, deepspeed.checkpointing) are those same objects."""
import importlib
import os

import chorus.deepspeed as ds

# (DeepSpeed's module, a name DeepSpeed defines in it)
DEFINED_AT = [
    ("runtime.engine", "DeepSpeedEngine"),
    ("runtime.pipe.engine", "PipelineEngine"),
    ("runtime.pipe.module", "PipelineModule"),
    ("runtime.pipe.module", "LayerSpec"),
    ("runtime.pipe.module", "TiedLayerSpec"),
    ("runtime.pipe.topology", "ProcessTopology"),
    ("runtime.pipe.topology", "PipeModelDataParallelTopology"),
    ("runtime.zero.partition_parameters", "Init"),
    ("runtime.zero.partition_parameters", "GatheredParameters"),
    ("runtime.activation_checkpointing.checkpointing", "checkpoint"),
    ("runtime.activation_checkpointing.checkpointing", "configure"),
    ("runtime.lr_schedules", "WarmupLR"),
    ("utils.zero_to_fp32", "get_fp32_state_dict_from_zero_checkpoint"),
    ("utils.zero_to_fp32", "convert_zero_checkpoint_to_fp32_state_dict"),
    ("checkpoint.utils", "clone_tensors_for_torch_save"),
    ("ops.adam.cpu_adam", "DeepSpeedCPUAdam"),
    ("ops.adam.fused_adam", "FusedAdam"),
    ("moe.layer", "MoE"),
    ("moe.sharded_moe", "TopKGate"),
    ("moe.sharded_moe", "MOELayer"),
    ("moe.experts", "Experts"),
    ("moe.utils", "split_params_into_different_moe_groups_for_optimizer"),
    ("sequence.layer", "DistributedAttention"),
]

# chorus's own additions beside DeepSpeed's names at the top level
TOP_LEVEL_FILES = {"__init__.py", "_version.py", "alias.py", "elastic.py",
                   "zero_to_fp32.py"}  # the last: what checkpoint folders written before the move import


def test_deepspeed_paths_define_the_implementation():
    for path, name in DEFINED_AT:
        module = importlib.import_module(f"chorus.deepspeed.{path}")
        obj = getattr(module, name)
        assert obj.__module__ == module.__name__, f"deepspeed.{path}.{name} is defined in {obj.__module__}"


def test_short_names_are_the_same_objects():
    from chorus.deepspeed.runtime.activation_checkpointing import checkpointing
    from chorus.deepspeed.runtime.pipe import module
    from chorus.deepspeed.runtime.zero import partition_parameters
    from chorus.deepspeed.runtime.base_optimizer import DeepSpeedOptimizer, ZeROOptimizer
    assert ds.checkpointing is checkpointing
    assert ds.pipe.PipelineModule is module.PipelineModule
    assert ds.zero.Init is partition_parameters.Init and ds.runtime.zero.Init is partition_parameters.Init
    assert ds.DeepSpeedEngine is importlib.import_module("chorus.deepspeed.runtime.engine").DeepSpeedEngine
    assert DeepSpeedOptimizer is ZeROOptimizer


def test_no_second_tree_at_the_top_level():
    here = os.path.dirname(ds.__file__)
    files = {f for f in os.listdir(here) if f.endswith(".py")}
    assert files == TOP_LEVEL_FILES, f"implementation outside DeepSpeed's paths: {sorted(files - TOP_LEVEL_FILES)}"
