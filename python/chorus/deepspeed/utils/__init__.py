"""deepspeed.utils: the logger, offline consolidation of ZeRO checkpoints, ZeRO-3 leaf modules."""
import logging as _logging
import sys as _sys

from chorus.deepspeed.utils import groups, logging  # noqa: F401
from chorus.deepspeed.utils.logging import log_dist, logger  # noqa: F401
from chorus.deepspeed.utils.zero_to_fp32 import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint)


def set_z3_leaf_modules(model, leaf_module_classes):
    """Marks modules of these classes (or class names) as ZeRO-3 leaves: their
    parameters and their children's are gathered together before the module runs.
    Returns the modules marked."""
    marked = []
    for m in model.modules():
        if any((isinstance(c, str) and type(m).__name__ == c) or (isinstance(c, type) and isinstance(m, c))
               for c in leaf_module_classes):
            m._z3_leaf = True
            marked.append(m)
    if not marked:
        raise ValueError(f"set_z3_leaf_modules: no module of {leaf_module_classes} in the model")
    return marked


def unset_z3_leaf_modules(model, leaf_module_classes):
    marked = []
    for m in model.modules():
        if getattr(m, "_z3_leaf", False) and any(
                (isinstance(c, str) and type(m).__name__ == c) or (isinstance(c, type) and isinstance(m, c))
                for c in leaf_module_classes):
            m._z3_leaf = False
            marked.append(m)
    return marked


def z3_leaf_module(module):
    return getattr(module, "_z3_leaf", False)


def get_z3_leaf_modules(model):
    return [m for m in model.modules() if z3_leaf_module(m)]
