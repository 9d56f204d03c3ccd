"""Reading DeepSpeed's .pt checkpoint files without trusting them: torch.load through an
unpickler that builds tensors, containers and numbers, and in place of DeepSpeed's own
classes (its loss scaler, ZeroStageEnum, fragment_address) inert records of what was
stored. Any other global a file names is refused, naming it, so a file cannot make the
load run code (torch's weights_only does the same for plain tensors, but refuses
DeepSpeed's classes, which every DeepSpeed checkpoint holds)."""
import collections
import pickle

import torch

_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("torch", "Size"): torch.Size,
    ("builtins", "set"): set, ("__builtin__", "set"): set,
    ("builtins", "frozenset"): frozenset, ("__builtin__", "frozenset"): frozenset,
    ("builtins", "slice"): slice, ("__builtin__", "slice"): slice,
    ("builtins", "complex"): complex,
}
_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}


class Record:
    """One of DeepSpeed's objects: its class name, the arguments it was made with, its state."""
    qualname = "?"

    def __init__(self, *args, **kwargs):
        self.__dict__["args"], self.__dict__["state"] = args, dict(kwargs)

    def __setstate__(self, state):
        self.__dict__["state"] = state if isinstance(state, dict) else {"state": state}

    def __getattr__(self, name):
        state = self.__dict__.get("state") or {}
        if name in state:
            return state[name]
        raise AttributeError(f"{self.qualname} record has no {name!r}")

    def __repr__(self):
        return f"Record({self.qualname}, args={self.__dict__.get('args')}, state={self.__dict__.get('state')})"


def _record_class(module, name):
    return type(name, (Record,), {"qualname": f"{module}.{name}", "record_of": f"{module}.{name}",
                                  "__new__": lambda cls, *a, **k: object.__new__(cls)})


def _safe_getattr(obj, name):
    """getattr(EnumClass, "member"), as enums pickle: only on records."""
    if isinstance(obj, type) and hasattr(obj, "record_of"):
        return obj(name)
    raise pickle.UnpicklingError(f"DeepSpeed checkpoint: getattr({obj!r}, {name!r}) is not allowed in a checkpoint")


class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _DTYPES:
            return getattr(torch, name)
        if module in ("builtins", "__builtin__") and name == "getattr":
            return _safe_getattr
        if module == "deepspeed" or module.startswith("deepspeed."):
            return _record_class(module, name)
        raise pickle.UnpicklingError(f"DeepSpeed checkpoint: the file names {module}.{name}, which a checkpoint "
                                     "has no reason to hold; refused")


_STORAGES = {"FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
             "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
             "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
             "BoolStorage": torch.bool}


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return storage.as_strided(size, stride, offset)


class _Storage:
    def __init__(self, dtype):
        self.dtype = dtype


def load(path):
    """A DeepSpeed .pt file (torch's zip format) read on the CPU through the unpickler above,
    its storages read here (torch.load would let the file choose its unpickler's classes)."""
    import zipfile
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"DeepSpeed checkpoint: {path} is not a torch zip file ({e})") from None
    with archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise ValueError(f"DeepSpeed checkpoint: {path} has no single data.pkl (truncated or not torch.save's)")
        prefix = pkl[0][:-len("data.pkl")]
        loaded = {}

        class _Reader(Unpickler):
            def find_class(self, module, name):
                if module == "torch" and name in _STORAGES:
                    return _Storage(_STORAGES[name])
                if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                    return _rebuild_tensor
                if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
                    return lambda func, new_type, args, state: func(*args)  # (a plain tensor, whatever its type)
                if (module, name) in (("torch", "Tensor"), ("torch.nn.parameter", "Parameter")):
                    return None
                return super().find_class(module, name)

            def persistent_load(self, pid):
                if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
                    raise pickle.UnpicklingError(f"DeepSpeed checkpoint: {path}: unknown record {pid!r}")
                kind, key, numel = pid[1], str(pid[2]), int(pid[4])
                dtype = kind.dtype if isinstance(kind, _Storage) else getattr(kind, "dtype", None)
                if dtype is None:
                    raise pickle.UnpicklingError(f"DeepSpeed checkpoint: {path}: storage of unknown type {kind!r}")
                if key not in loaded:
                    raw = archive.read(f"{prefix}data/{key}")
                    item = torch.empty(0, dtype=dtype).element_size()
                    if len(raw) < numel * item:
                        raise ValueError(f"DeepSpeed checkpoint: {path}: storage {key} holds {len(raw)} bytes, "
                                         f"not {numel * item}: truncated")
                    loaded[key] = torch.frombuffer(bytearray(raw[:numel * item]), dtype=dtype) if numel else \
                        torch.empty(0, dtype=dtype)
                return loaded[key]

        import io
        return _Reader(io.BytesIO(archive.read(pkl[0]))).load()
