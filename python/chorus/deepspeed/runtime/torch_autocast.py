"""DeepSpeed's torch_autocast mode: the model and its master weights stay fp32, the
forward runs under torch.autocast in the configured dtype, and the gradients of the
parameters of the "lower precision safe" modules (Linear and Conv by default) are
rounded to that dtype before the reduction (DeepSpeed's comm_dtype; chorus's reduction
then sums in fp32), the others stay fp32."""
import importlib

import torch

SAFE_MODULES = [torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d]
_DTYPES = {"torch.float16": torch.float16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
           "torch.bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "torch.float32": torch.float32, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}


def get_default_autocast_lower_precision_modules():
    return [f"{cls.__module__}.{cls.__name__}" for cls in SAFE_MODULES]


def _class(name):
    package, _, cls = name.rpartition(".")
    try:
        return getattr(importlib.import_module(package), cls)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"DeepSpeed config: 'torch_autocast.lower_precision_safe_modules' names {name!r}, "
                         f"which cannot be imported: {e}") from None


class Autocast:
    """The engine's autocast settings (section: the config's torch_autocast)."""

    def __init__(self, section, device, stage):
        given = section.get("dtype")
        if given is not None and str(given).lower() not in _DTYPES:
            raise ValueError(f"DeepSpeed config: 'torch_autocast.dtype' {given!r} is not a dtype (fp16, bf16, fp32)")
        self.device_type = device.type
        default = torch.get_autocast_cpu_dtype() if device.type == "cpu" else torch.float16
        self.dtype = _DTYPES[str(given).lower()] if given is not None else default
        if self.dtype == torch.float16 and stage == 0:
            raise ValueError("DeepSpeed config: 'torch_autocast' in fp16 without ZeRO scales the loss with torch's "
                             "GradScaler in DeepSpeed, which chorus does not have; use bf16 or a ZeRO stage")
        names = section.get("lower_precision_safe_modules")
        self.safe = tuple(SAFE_MODULES if names is None else [_class(n) for n in names])

    def mark(self, model):
        """DeepSpeed's comm_dtype on the safe modules' own parameters."""
        for module in model.modules():
            if type(module) in self.safe:  # (exact classes, as DeepSpeed's)
                for p in module.parameters(recurse=False):
                    p.comm_dtype = self.dtype

    def context(self):
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def comm_round(p, grad):
    """The gradient as it goes to the reduction: in the parameter's comm_dtype, if it has one."""
    dtype = getattr(p, "comm_dtype", None)
    return grad if dtype is None or dtype == grad.dtype else grad.to(dtype).to(grad.dtype)
