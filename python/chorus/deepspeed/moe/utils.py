"""deepspeed.moe.utils: telling expert parameters from the others, for optimizer groups."""
import torch


def is_moe_param(param):
    """Whether param belongs to an expert (its gradients are reduced over the expert-data-parallel set)."""
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_shared_and_expert_params(params):
    shared, expert = [], []
    for p in params:
        (expert if is_moe_param(p) else shared).append(p)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(group):
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=178956971):
    """Each optimizer group split in two: its shared parameters, and per expert group
    its experts' parameters in a group of their own (moe=True, name=the group's name),
    with the same hyperparameters. Accepts a dict, a tuple or a list of dicts."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: expected a dict, tuple or list of "
                         f"parameter groups, got {type(param_groups).__name__}")
    out, experts = [], []  # as DeepSpeed orders them: every shared group, then the expert groups
    for group in param_groups:
        params = list(group["params"])
        shared = [p for p in params if not is_moe_param(p)]
        by_name = {}
        for p in params:
            if is_moe_param(p):
                by_name.setdefault(p.group_name, []).append(p)
        base = {k: v for k, v in group.items() if k != "params"}
        out.append(dict(base, params=shared))
        for name, ps in by_name.items():
            # Groups of at most max_group_size elements, as DeepSpeed splits them.
            chunk, size = [], 0
            for p in ps:
                if chunk and size + p.numel() > max_group_size:
                    experts.append(dict(base, params=chunk, moe=True, name=name))
                    chunk, size = [], 0
                chunk.append(p)
                size += p.numel()
            if chunk:
                experts.append(dict(base, params=chunk, moe=True, name=name))
    return out + experts


def configure_moe_param_groups(model_parameters):
    """DeepSpeed's helper for model_parameters given to initialize: the MoE split of them."""
    if isinstance(model_parameters, (list, tuple)) and model_parameters and isinstance(model_parameters[0], dict):
        return split_params_into_different_moe_groups_for_optimizer(list(model_parameters))
    params = list(model_parameters)
    if any(is_moe_param(p) for p in params if isinstance(p, torch.Tensor)):
        return split_params_into_different_moe_groups_for_optimizer({"params": params})
    return params


def has_moe_layers(m):
    from chorus.deepspeed.moe.layer import MoE
    found = [mod for mod in m.modules() if isinstance(mod, MoE)]
    return bool(found), (found[0].num_experts if found else 0)
