"""DeepSpeed's JSON config: loaded from a path or a dict, checked by the C++ parser."""
import json
import math
import os

from chorus import _core
from chorus.deepspeed.runtime import config_keys


def _clean(node, path=""):
    """The config as clients write it: "auto" left by Transformers or Accelerate is
    an error naming the key; an infinite steps_per_print (Accelerate writes inf)
    means never print."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            if isinstance(v, float) and math.isinf(v) and k == "steps_per_print":
                continue
            out[k] = _clean(v, key)
        return out
    if isinstance(node, list):
        return [_clean(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if node == "auto":  # (the sections DeepSpeed validates take "auto" as their default: config_keys)
        raise ValueError(f"DeepSpeed config: '{path}' is \"auto\", which Transformers' Trainer or Accelerate fill "
                         "in; outside them give it a value")
    if isinstance(node, float) and (math.isinf(node) or math.isnan(node)):
        raise ValueError(f"DeepSpeed config: '{path}' is {node}, not a finite number")
    return node


def load_config(config=None, config_params=None, args=None):
    """The config as JSON text, from whichever of the DeepSpeed ways it was given."""
    given = [c for c in (config, config_params) if c is not None]
    if len(given) > 1:
        raise ValueError("deepspeed.initialize: pass the config once, as config= or config_params=, not both")
    source = given[0] if given else None
    if source is None and args is not None:
        source = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if source is None:
        raise ValueError("deepspeed.initialize: no config; pass config= (a dict or a JSON file path), "
                         "config_params=, or args.deepspeed_config")
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ValueError(f"deepspeed.initialize: config file '{path}' does not exist")
        with open(path) as f:
            text = f.read()
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"DeepSpeed config '{path}' is not valid JSON: {e}") from None
        return json.dumps(_clean(config_keys.check(parsed)))
    if isinstance(source, dict):
        return json.dumps(_clean(config_keys.check(source)))
    raise ValueError(f"deepspeed.initialize: config must be a dict or a path, not {type(source).__name__}")


def parse(text, world):
    """The resolved config (batch sizes completed) as a dict; ValueError on bad input."""
    return _core.ds_config_parse(text, world)


def per_rank(raw, cfg):
    """The config as JSON text with its batch given per rank (micro-batch and
    accumulation steps, no train_batch_size), for an engine over other ranks than
    the data-parallel world the batch was written for (an expert-data-parallel set;
    every sequence- and data-parallel rank)."""
    raw = dict(raw)
    raw.pop("train_batch_size", None)
    raw["train_micro_batch_size_per_gpu"] = cfg["train_micro_batch_size_per_gpu"]
    raw["gradient_accumulation_steps"] = cfg["gradient_accumulation_steps"]
    return json.dumps(raw)


def seq_parallel_comm_dtype(raw):
    """seq_parallel_communication_data_type (default fp32), checked as DeepSpeed checks it."""
    value = raw.get("seq_parallel_communication_data_type", "fp32")
    if value is None or str(value).lower() not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"DeepSpeed config: 'seq_parallel_communication_data_type' {value!r} is not one of "
                         "fp16, bf16, fp32 (as DeepSpeed's)")
    return str(value).lower()
