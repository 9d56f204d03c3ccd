"""chorus.deepspeed reads a config as DeepSpeed 0.19.8 does: every key of its table,
its other spellings, its refusals (removed features, typos inside validated
sections), warnings for what it silently ignores, and chorus's own refusals of
features a config switches on, each naming its key."""
import warnings

import pytest
import torch

from chorus.deepspeed.runtime import config_keys
from chorus.deepspeed.runtime.config_features import RULES
from chorus.deepspeed.runtime.config_table import ALIASES, FREE, KEYS, STRICT

# Sections that switch their feature on by being present at all (DeepSpeed's own rule).
PRESENCE = ("weight_quantization", "datastates_ckpt")


def nested(paths):
    """A config holding each dotted path with its table default."""
    cfg = {}
    for path, default in paths:
        node = cfg
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            if parts[-1] not in node:
                node[parts[-1]] = default
    return cfg


def checked(cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = config_keys.check(cfg)
    return out, [str(w.message) for w in caught]


def test_every_key_of_the_table_is_accepted_with_its_default():
    usable = [(k, v) for k, v in KEYS.items()
              if "*" not in k and "[]" not in k and not any(k == p or k.startswith(p + ".") for p in PRESENCE)
              and not any(k.startswith(f + ".") for f in FREE)]
    cfg = nested(usable)
    assert len(usable) > 250 and "zero_optimization" in cfg and "flops_profiler" in cfg
    out, warned = checked(cfg)
    assert warned == []
    # The stage3_ spellings chorus reads: DeepSpeed's field names are mapped to them.
    assert out["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False
    assert "gather_16bit_weights_on_model_save" not in out["zero_optimization"]


def test_sections_present_by_default_switch_on_and_are_refused_by_name():
    for section in PRESENCE:
        cfg = nested([(section, {})]) if "." in section else {section: {}}
        with pytest.raises(ValueError, match=f"'{section}'"):
            config_keys.check(cfg)


@pytest.mark.parametrize("key, on, _", RULES, ids=[r[0] for r in RULES])
def test_each_refusal_names_its_key_and_only_when_on(key, on, _):
    values = {"zero_optimization.offload_optimizer.device": "nvme", "zero_optimization.offload_param.device": "nvme",
              "zero_optimization.offload_optimizer.ratio": 0.5, "zero_optimization.zero_hpz_partition_size": 2,
              "data_types.grad_accum_dtype": "fp32", "gradient_allreduce_op": "sum",
              "tensor_parallel.autotp_size": 2,
              "managed_gradient_accumulation": False}
    cfg = nested([(key, values.get(key, {} if key in PRESENCE else True))])
    if key == "data_types.grad_accum_dtype":
        cfg["bf16"] = {"enabled": True}
    assert on(cfg)
    with pytest.raises(ValueError, match=f"'{key}' is switched on, and chorus refuses it: .+"):
        config_keys.check(cfg)
    if key not in PRESENCE:
        off = nested([(key, KEYS.get(key, False))])
        assert not on(off), key
        checked(off)


def test_other_spellings_map_to_one_setting():
    out, _ = checked({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "cpu_offload": True,
                                            "stage3_gather_fp16_weights_on_model_save": True}})
    z = out["zero_optimization"]
    assert z["stage3_prefetch_bucket_size"] == 7 and z["offload_optimizer"] == {"device": "cpu"}
    assert z["stage3_gather_16bit_weights_on_model_save"] is True
    with pytest.raises(ValueError, match="given twice"):
        config_keys.check({"zero_optimization": {"max_live_parameters": 1, "stage3_max_live_parameters": 2}})
    with pytest.raises(ValueError, match="old form of 'offload_optimizer'"):
        config_keys.check({"zero_optimization": {"cpu_offload": True, "offload_optimizer": {"device": "cpu"}}})
    out, _ = checked({"bfloat16": {"enabled": True}})
    assert out["bf16"] == {"enabled": True} and "bfloat16" not in out
    out, _ = checked({"zero_optimization": True, "allgather_size": 1000})
    assert out["zero_optimization"] == {"stage": 1, "allgather_bucket_size": 1000}
    sections = {".".join(k.split(".")[:i]) for k in KEYS for i in range(1, k.count(".") + 1)}
    assert all(target in KEYS or target in sections for target in ALIASES.values())


def test_removed_features_are_refused_as_deepspeed_refuses_them():
    for key in ("elasticity", "progressive_layer_drop", "sparse_attention", "amp", "compression_training",
                "curriculum_learning"):
        with pytest.raises(ValueError, match=f"'{key}': DeepSpeed 0.19.8 removed"):
            config_keys.check({key: {"enabled": True}})
    with pytest.raises(ValueError, match="'zero_optimization.mics_shard_size': DeepSpeed 0.19.8 removed MiCS"):
        config_keys.check({"zero_optimization": {"mics_shard_size": 8}})


def test_unknown_keys_warn_where_deepspeed_ignores_them_and_fail_where_it_validates():
    out, warned = checked({"train_batch_size": 8, "tensorbord": {"enabled": True}, "cuda_visible_devices": "0",
                           "_comment": "a note", "flops_profiler": {"enabled": False, "profile_stp": 3}})
    assert any("'tensorbord'" in w and "did you mean 'tensorboard'" in w for w in warned), warned
    assert any("'cuda_visible_devices'" in w for w in warned)
    assert any("'flops_profiler.profile_stp'" in w and "'flops_profiler.profile_step'" in w for w in warned)
    assert not any("_comment" in w for w in warned) and len(warned) == 3
    for section in sorted(STRICT):
        if section.startswith("tensor_parallel.") or section == "bfloat16":
            continue
        cfg = nested([(section + ".enabledd", True)])
        with pytest.raises(ValueError, match=f"unknown key '{section}.enabledd'.*DeepSpeed refuses it too"):
            config_keys.check(cfg)
    with pytest.raises(ValueError, match="unknown key 'zero_optimization._comment'"):
        config_keys.check({"zero_optimization": {"_comment": "not here"}})


def test_auto_is_the_default_in_validated_sections_and_an_error_elsewhere():
    import chorus.deepspeed.runtime.config as ds_config
    out, _ = checked({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    assert out["zero_optimization"] == {"stage": 2}
    with pytest.raises(ValueError, match="'train_batch_size' is \"auto\""):
        ds_config.load_config({"train_batch_size": "auto"})


def test_an_engine_without_an_optimizer_runs_forward_and_backward(ranks):
    out = ranks(1, "ds_no_optimizer.py")
    assert out.returncode == 0, out.stdout
    assert "no optimizer ok" in out.stdout, out.stdout
