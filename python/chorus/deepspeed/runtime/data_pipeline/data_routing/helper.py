"""Putting random-LTD into a model and taking it out of its state dicts."""
from collections import OrderedDict

from chorus.deepspeed.runtime.data_pipeline.data_routing.basic_layer import RandomLayerTokenDrop


def convert_to_random_ltd(model, convert_type):
    """Wraps every convert_type layer of the engine's model in RandomLayerTokenDrop,
    then lets the engine wire them to its schedule (random_ltd_initialize)."""
    inner = model.module if hasattr(model, "module") else model
    for name, module in list(inner.named_modules()):
        if isinstance(module, convert_type) and name:
            parent_name, _, child = name.rpartition(".")
            parent = inner.get_submodule(parent_name) if parent_name else inner
            setattr(parent, child, RandomLayerTokenDrop(module))
    model.random_ltd_initialize()
    return model


def remove_random_ltd_state_dict(state_dict):
    """The state dict with the wrappers' '.random_ltd_layer' taken out of the names."""
    return OrderedDict((k.replace(".random_ltd_layer", ""), v) for k, v in state_dict.items())


def save_without_random_ltd(model):
    inner = model.module if hasattr(model, "module") else model
    return remove_random_ltd_state_dict(inner.state_dict())
