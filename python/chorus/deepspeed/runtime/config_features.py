"""The features of a DeepSpeed 0.19.8 config that chorus refuses by name when the config
switches them on, each saying why and what to use instead (docs/deepspeed.md's table
says what chorus does with every section)."""


def _get(cfg, path, default=None):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _dtype_name(value):
    v = str(value).lower().replace("torch.", "")
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}.get(v, v)


def _model_dtype(cfg):
    if _get(cfg, "fp16.enabled"):
        return "fp16"
    if _get(cfg, "bf16.enabled"):
        return "bf16"
    return "fp32"


# (key, switched on?, why chorus refuses it and what to use instead)
RULES = [
    ("zero_optimization.offload_optimizer.ratio",
     lambda c: float(_get(c, "zero_optimization.offload_optimizer.ratio", 1.0)) < 1.0,
     "chorus offloads the whole optimizer state or none of it; use 1.0"),
    ("zero_optimization.offload_optimizer.super_offload",
     lambda c: bool(_get(c, "zero_optimization.offload_optimizer.super_offload")),
     "SuperOffload (GH200 superchips) is not in chorus; use offload_optimizer.device \"cpu\""),
    ("zero_optimization.zero_quantized_weights", lambda c: bool(_get(c, "zero_optimization.zero_quantized_weights")),
     "ZeRO++'s quantized weights belong to chorus's slow-link work, not built yet; remove the key"),
    ("zero_optimization.zero_quantized_nontrainable_weights",
     lambda c: bool(_get(c, "zero_optimization.zero_quantized_nontrainable_weights")),
     "ZeRO++'s quantized weights belong to chorus's slow-link work, not built yet; remove the key"),
    ("zero_optimization.zero_quantized_gradients",
     lambda c: bool(_get(c, "zero_optimization.zero_quantized_gradients")),
     "ZeRO++'s quantized gradients belong to chorus's slow-link work, not built yet; remove the key"),
    ("zero_optimization.zero_hpz_partition_size",
     lambda c: int(_get(c, "zero_optimization.zero_hpz_partition_size", 1) or 1) > 1,
     "ZeRO++'s secondary partition (hpZ) belongs to chorus's slow-link work, not built yet; chorus's "
     "hierarchical collectives already keep the allgather within a host first"),
    ("fp16.fp16_master_weights_and_grads", lambda c: bool(_get(c, "fp16.fp16_master_weights_and_grads")),
     "chorus keeps fp32 master weights and gradients; remove the key"),
    ("data_types.grad_accum_dtype",
     lambda c: _get(c, "data_types.grad_accum_dtype") is not None and
     _dtype_name(_get(c, "data_types.grad_accum_dtype")) != _model_dtype(c),
     "chorus accumulates gradients in the model's dtype; remove the key or give the model's dtype"),
    ("gradient_allreduce_op", lambda c: str(_get(c, "gradient_allreduce_op", "mean")).lower() != "mean",
     "chorus averages the gradients over the data-parallel ranks; use \"mean\" and scale the loss instead"),
    ("compile.deepcompile", lambda c: bool(_get(c, "compile.deepcompile")),
     "DeepCompile is not in chorus; call torch.compile on the model"),
    ("datastates_ckpt", lambda c: "datastates_ckpt" in c and c["datastates_ckpt"] is not False,
     "the DataStates checkpoint engine is not in chorus; remove the key"),
    ("hybrid_engine.enabled", lambda c: bool(_get(c, "hybrid_engine.enabled")),
     "the RLHF hybrid engine (DeepSpeed-Inference kernels in training) is not in chorus; remove the section"),
    ("tensor_parallel.autotp_size", lambda c: int(_get(c, "tensor_parallel.autotp_size", 0) or 0) > 0,
     "AutoTP is not in chorus; build the model from chorus.parallel's layers and pass mpu="),
    ("expert_parallel.enabled", lambda c: bool(_get(c, "expert_parallel.enabled")),
     "AutoEP is not in chorus; build the experts with deepspeed.moe.layer.MoE"),
    ("weight_quantization", lambda c: "weight_quantization" in c,
     "weight quantization at zero.Init is not in chorus; remove the section"),
    ("managed_gradient_accumulation", lambda c: _get(c, "managed_gradient_accumulation", True) is False,
     "chorus's engine always manages the accumulation steps; remove the key"),
]


def refuse_unsupported(cfg):
    for key, on, why in RULES:
        if on(cfg):
            raise ValueError(f"DeepSpeed config: '{key}' is switched on, and chorus refuses it: {why}")
    batching = "data_efficiency.data_sampling.dynamic_batching"
    if _get(cfg, batching + ".enabled") and _get(cfg, batching + ".max_tokens") is None:
        raise ValueError(f"DeepSpeed config: '{batching}.max_tokens' is needed when dynamic batching is enabled "
                         "(the micro-batches are packed up to it), as DeepSpeed requires")
