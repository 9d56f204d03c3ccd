"""Which optimizer the engine runs, as DeepSpeed 0.19.8's _configure_basic_optimizer
chooses it: from the client's optimizer or the config's `optimizer` section.

The result is (kind, groups, client): kind names a kernel of chorus's ZeRO engine
(adam, adamw, sgd, lion, adagrad, lamb), which steps the fp32 partition itself, or muon;
or kind is None and client is a torch optimizer the engine runs as given over
fp32 views of its partition (any torch.optim class DeepSpeed would build)."""
import inspect
import warnings

import torch

# DeepSpeed's own types, case-insensitive; any other type is a torch.optim class name, as written.
_DEEPSPEED_TYPES = ("adam", "adamw", "lamb", "lion", "adagrad", "muon", "muadam", "muadamw", "musgd")
_REMOVED = ("onebitadam", "zerooneadam", "onebitlamb")


def _config_error(msg):
    return ValueError(f"DeepSpeed config: {msg}")


def _check_params(kind, params, allowed):
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise _config_error(f"'optimizer.params' {unknown} are not parameters of {kind} "
                            f"(it takes {sorted(allowed)})")


def _group(params, defaults):
    g = dict(defaults)
    g.update({k: v for k, v in params.items() if k in defaults})
    if "betas" in g:
        g["betas"] = tuple(float(b) for b in g["betas"])
    return g


def _torch_class(name):
    cls = getattr(torch.optim, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise _config_error(f"'optimizer.type' {name!r} is neither one of DeepSpeed's optimizers "
                            f"(Adam, AdamW, Lamb, Lion, Adagrad, Muon) nor a torch.optim class "
                            "(names of torch.optim classes are case-sensitive, e.g. SGD, RMSprop)")
    return cls


def from_config(section, offload, model_params):
    """The config's optimizer section (type and params, as the user wrote them)."""
    name = section["type"]
    params = dict(section.get("params") or {})
    low = name.lower()
    if "max_grad_norm" in params:
        raise _config_error("'optimizer.params.max_grad_norm' is not supported as an optimizer parameter; use "
                            "'gradient_clipping' (as DeepSpeed says)")
    if low in _REMOVED:
        raise _config_error(f"'optimizer.type' {name}: DeepSpeed 0.19.8 no longer has the 1-bit optimizers "
                            "(OneBitAdam, ZeroOneAdam, OneBitLamb); use Adam, AdamW or Lamb")
    if low in ("adam", "adamw"):
        adam_w_mode = params.pop("adam_w_mode", True)
        params.pop("torch_adam", None)  # torch's Adam or DeepSpeed's fused one: the same update
        params.pop("fp32_optimizer_states", None)  # chorus's optimizer states are always fp32
        allowed = ("lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad", "foreach",
                   "fused", "capturable", "differentiable", "maximize", "set_grad_none")
        _check_params(name, params, allowed)
        if params.get("amsgrad") or params.get("maximize"):  # torch's Adam runs them, as DeepSpeed's torch_adam
            cls = torch.optim.AdamW if (low == "adamw" or adam_w_mode) else torch.optim.Adam
            kept = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
            return None, None, cls(model_params, **{k: v for k, v in params.items() if k in kept})
        kind = "adamw" if (low == "adamw" or adam_w_mode) else "adam"
        return kind, [_group(params, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                                      "bias_correction": True})], None
    if low == "lion":
        params.pop("fp32_optimizer_states", None)
        _check_params(name, params, ("lr", "betas", "weight_decay", "set_grad_none"))
        return "lion", [_group(params, {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.0})], None
    if low == "adagrad":
        params.pop("fp32_optimizer_states", None)
        if offload:  # DeepSpeedCPUAdagrad's parameters
            _check_params(name, params, ("lr", "eps", "weight_decay", "amsgrad"))
        else:  # torch.optim.Adagrad's
            _check_params(name, params, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
                                         "foreach", "maximize", "differentiable", "fused"))
            if params.get("maximize"):
                return None, None, torch.optim.Adagrad(model_params, **params)
        return "adagrad", [_group(params, {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.0, "lr_decay": 0.0,
                                           "initial_accumulator_value": 0.0})], None
    if low == "lamb":
        _check_params(name, params, ("lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                                     "max_grad_norm", "max_coeff", "min_coeff", "amsgrad"))
        if params.get("amsgrad"):
            raise _config_error("'optimizer.params.amsgrad': FusedLamb does not support the AMSGrad variant")
        return "lamb", [_group(params, {"lr": 1e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                                        "eps_inside_sqrt": False, "weight_decay": 0.0, "max_coeff": 10.0,
                                        "min_coeff": 0.01})], None
    if low == "sgd" and name != "SGD":  # chorus has always taken lower-case sgd too
        name = "SGD"
    if low in ("muadam", "muadamw", "musgd"):
        try:
            import mup
        except ImportError:
            raise _config_error(f"'optimizer.type' {name} needs the mup package (pip install mup), as in "
                                "DeepSpeed") from None
        cls = {"muadam": mup.MuAdam, "muadamw": mup.MuAdamW, "musgd": mup.MuSGD}[low]
        return None, None, cls(model_params, **params)
    if low == "muon":
        from chorus.deepspeed.runtime import muon
        _check_params(name, params, muon.CONFIG_PARAMS)
        return "muon", muon.param_groups(model_params, params), None
    cls = _torch_class(name)
    if cls is torch.optim.SGD:
        _check_params(name, params, ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                                     "foreach", "differentiable", "fused"))
        if not params.get("maximize"):
            return "sgd", [_group(params, {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                                           "nesterov": False})], None
    return None, None, cls(model_params, **params)


def from_client(client, offload):
    """A client optimizer: chorus's kernels where one is the same update, else as given."""
    from chorus.deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from chorus.deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from chorus.deepspeed.ops.lamb import FusedLamb
    from chorus.deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    t = type(client)
    if t in (DeepSpeedCPUAdam, FusedAdam):  # DeepSpeed's own: chorus's kernels are the equivalent
        return ("adamw" if client.adam_w_mode else "adam"), client.param_groups, None
    if t in (DeepSpeedCPULion, FusedLion):
        return "lion", client.param_groups, None
    if t is DeepSpeedCPUAdagrad:
        return "adagrad", client.param_groups, None
    if t is FusedLamb:
        for g in client.param_groups:
            g["eps_inside_sqrt"] = client.eps_inside_sqrt
        return "lamb", client.param_groups, None
    plain = not any(g.get("amsgrad") or g.get("maximize") for g in client.param_groups)
    kind = None
    if t is torch.optim.Adam and plain:
        kind = "adam"
    elif t is torch.optim.AdamW and plain:
        kind = "adamw"
    elif t is torch.optim.SGD and plain:
        kind = "sgd"
    elif t is torch.optim.Adagrad and plain:
        kind = "adagrad"
    if kind in ("adam", "adamw"):
        where = "with CPU offload " if offload else ""
        warnings.warn(f"chorus: stepping the client torch.optim.{t.__name__} {where}with chorus's "
                      "SIMD CPU Adam and the client's hyperparameters (DeepSpeed would refuse a client "
                      "optimizer with offload unless zero_force_ds_cpu_optimizer is false)")
    elif kind is None:
        warnings.warn(f"chorus: {t.__name__} cannot be translated to chorus's kernels; it runs as "
                      "given on the fp32 partition, which is slower than chorus's own kernels")
    return kind, client.param_groups, (client if kind is None else None)


def translate(client, section, offload, model_params):
    """(kind, groups, client_to_run); (None, None, None) when there is no optimizer at all
    (DeepSpeed builds the engine; step() then says there is nothing to step)."""
    if client is not None:
        if section is not None:
            warnings.warn("deepspeed.initialize: both a client optimizer and an 'optimizer' config section were "
                          "given; the client optimizer takes precedence, as in DeepSpeed")
        return from_client(client, offload)
    if section is None:
        return None, None, None
    kind, groups, run = from_config(section, offload, model_params)
    if run is not None:
        return None, run.param_groups, run
    # Parameter groups given as dicts (model_parameters) keep their own settings over the config's.
    given = [g for g in model_params if isinstance(g, dict)]
    if given and kind != "muon":  # (Muon's halves were made from the given groups already)
        groups = [dict(groups[0], **{k: v for k, v in g.items()}) for g in given]
    return kind, groups, None
