"""A DeepSpeed config read as DeepSpeed 0.19.8 reads it, against its whole key
table (config_table.py): other spellings mapped to the one chorus reads, keys
DeepSpeed removed refused with its reason, a typo inside a section DeepSpeed
validates refused, an unknown key elsewhere a warning with the nearest key
(DeepSpeed ignores those), and every feature chorus does not have refused by
name when the config switches it on (config_features.py; docs/deepspeed.md's
table says what chorus does with each section)."""
import difflib
import warnings

from chorus.deepspeed.runtime.config_table import ALIASES, CHORUS_KEYS, FREE, KEYS, STRICT

# Every section path (a prefix of a key), and each level's names, for "did you mean".
_SECTIONS = {".".join(k.split(".")[:i]) for k in KEYS for i in range(1, k.count(".") + 1)}
_KNOWN = set(KEYS) | _SECTIONS | set(ALIASES) | set(CHORUS_KEYS)

# DeepSpeed 0.19.8 refuses these as soon as they appear (features it removed); chorus says the same.
REMOVED = {
    "nebula": "DeepSpeed 0.19.8 removed Nebula checkpointing; remove the section (checkpoints are written "
              "by save_checkpoint)",
    "compression_training": "DeepSpeed 0.19.8 removed its compression library; the model would train "
                            "unquantized, so remove the section",
    "amp": "DeepSpeed 0.19.8 removed Apex AMP; use 'fp16' or 'bf16'",
    "quantize_training": "DeepSpeed 0.19.8 removed MoQ (quantize_training); remove the section",
    "sparse_gradients": "DeepSpeed 0.19.8 removed this flag; embeddings made with sparse=True need none",
    "eigenvalue": "DeepSpeed 0.19.8 removed the eigenvalue (MoQ) section; remove it",
    "sparse_attention": "DeepSpeed 0.19.8 removed Sparse Attention; remove the section",
    "elasticity": "DeepSpeed 0.19.8 removed its elasticity section; set the batch sizes directly (chorus's "
                  "elastic jobs: chorusrun --min-np/--max-np and chorus.torch.elastic)",
    "graph_harvesting": "DeepSpeed 0.19.8 removed graph harvesting; remove the key",
    "curriculum_learning": "DeepSpeed 0.19.8 removed the top-level curriculum_learning; it lives under "
                           "'data_efficiency.data_sampling.curriculum_learning'",
    "progressive_layer_drop": "DeepSpeed 0.19.8 removed Progressive Layer Dropping; remove the section",
    "zero_optimization.mics_shard_size": "DeepSpeed 0.19.8 removed MiCS; remove the key",
    "zero_optimization.mics_hierarchical_params_gather": "DeepSpeed 0.19.8 removed MiCS; remove the key",
    "zero_optimization.zeropp_loco_param": "DeepSpeed 0.19.8 removed LoCo-ZeRO++; remove the key",
}

# The ZeRO keys chorus reads under their stage3_ spellings (DeepSpeed takes both).
_ZERO_STAGE3 = ("prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
                "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                "module_granularity_threshold", "use_all_reduce_for_fetch_params", "allgather_sequential")


def _error(msg):
    return ValueError(f"DeepSpeed config: {msg}")


def _nearest(path):
    """The nearest known key at path's level."""
    parent, _, key = path.rpartition(".")
    prefix = parent + "." if parent else ""
    level = sorted({k[len(prefix):].split(".")[0] for k in _KNOWN if k.startswith(prefix)})
    best = difflib.get_close_matches(key, level, n=1, cutoff=0.6)
    return prefix + best[0] if best else None


def _normalize(cfg):
    """Other spellings DeepSpeed accepts, as the keys chorus reads; DeepSpeed's own errors for both at once."""
    cfg = dict(cfg)
    if isinstance(cfg.get("bfloat16"), dict):
        spelt = cfg.pop("bfloat16")
        if cfg.get("bf16") is None:  # DeepSpeed reads bfloat16 only when bf16 is absent
            cfg["bf16"] = spelt
    z = cfg.get("zero_optimization")
    if isinstance(z, bool):  # DeepSpeed's legacy form: true is stage 1
        cfg["zero_optimization"] = {"stage": 1 if z else 0}
        if "allgather_size" in cfg:
            cfg["zero_optimization"]["allgather_bucket_size"] = cfg.pop("allgather_size")
    elif isinstance(z, dict):
        z = dict(z)
        for name in _ZERO_STAGE3:
            if name in z:
                if "stage3_" + name in z:
                    raise _error(f"'zero_optimization.{name}' and 'zero_optimization.stage3_{name}' are one "
                                 "setting given twice; keep one")
                z["stage3_" + name] = z.pop(name)
        old = "stage3_gather_fp16_weights_on_model_save"
        if old in z:
            if "stage3_gather_16bit_weights_on_model_save" in z:
                raise _error(f"'zero_optimization.{old}' is the old name of "
                             "'gather_16bit_weights_on_model_save', which is also given; keep the new one")
            z["stage3_gather_16bit_weights_on_model_save"] = z.pop(old)
        for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            if old in z:
                if z.get(new) is not None:
                    raise _error(f"'zero_optimization.{old}' is the old form of '{new}', which is also given; "
                                 f"keep '{new}'")
                if z.pop(old):
                    z[new] = {"device": "cpu"}
        z.pop("cpu_offload_use_pin_memory", None)  # deprecated by DeepSpeed, no effect there either
        cfg["zero_optimization"] = z
    tp = cfg.get("tensor_parallel")
    if isinstance(tp, dict) and "tp" in tp:
        if "tensor_parallel" in tp:
            raise _error("'tensor_parallel.tp' and 'tensor_parallel.tensor_parallel' are one section given "
                         "twice; keep one")
        tp = dict(tp)
        tp["tensor_parallel"] = tp.pop("tp")
        cfg["tensor_parallel"] = tp
    return cfg


def _canonical(path):
    """The KEYS name of a path in the normalized config (stage3_ spellings, tp alias)."""
    parts = path.split(".")
    if parts[0] == "zero_optimization" and len(parts) == 2 and parts[1].startswith("stage3_"):
        return "zero_optimization." + parts[1][len("stage3_"):]
    return ALIASES.get(path, path)


def _drop_auto(node, path):
    """DeepSpeed's validated sections take "auto" as their default (its pydantic models drop the key)."""
    if not isinstance(node, dict):
        return node
    strict = _canonical(path) in STRICT
    return {k: _drop_auto(v, f"{path}.{k}" if path else k) for k, v in node.items()
            if not (strict and isinstance(v, str) and v == "auto")}


def _walk(node, path, out):
    """Checks the keys under path; collects warnings for unknown keys where DeepSpeed ignores them."""
    for key, value in node.items():
        here = f"{path}.{key}" if path else str(key)
        canon = _canonical(here)
        if canon in FREE:
            continue
        if canon in REMOVED:
            raise _error(f"'{here}': {REMOVED[canon]}")
        if canon not in _KNOWN:
            strict = _canonical(path) in STRICT
            if str(key).startswith("_") and not strict:
                continue  # a comment, as DeepSpeed ignores it
            near = _nearest(canon)
            hint = f"; did you mean '{near}'?" if near else ""
            if strict:
                raise _error(f"unknown key '{here}'{hint} (DeepSpeed refuses it too: '{path}' is a section it "
                             "validates)")
            out.append(f"DeepSpeed config: unknown key '{here}' is ignored, as DeepSpeed ignores it{hint}")
            continue
        if isinstance(value, dict) and canon in _SECTIONS:
            _walk(value, here, out)


def check(cfg):
    """The config with other spellings normalized; raises ValueError on what DeepSpeed
    refuses and on features chorus does not have that the config switches on; warns
    (Python warnings) about unknown keys DeepSpeed would silently ignore."""
    if not isinstance(cfg, dict):
        raise _error(f"the config must be a JSON object, not {type(cfg).__name__}")
    for key in cfg:
        if key in REMOVED:
            raise _error(f"'{key}': {REMOVED[key]}")
    cfg = _drop_auto(_normalize(cfg), "")
    found = []
    _walk(cfg, "", found)
    from chorus.deepspeed.runtime.config_features import refuse_unsupported
    refuse_unsupported(cfg)
    for msg in found:
        warnings.warn(msg, stacklevel=3)
    return cfg
