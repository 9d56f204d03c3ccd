"""Pipeline parallelism as ``deepspeed.pipe``: PipelineModule, LayerSpec, TiedLayerSpec."""
from chorus.deepspeed.runtime.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from chorus.deepspeed.runtime.pipe.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                            ProcessTopology)

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology", "PipeDataParallelTopology",
           "PipeModelDataParallelTopology"]
