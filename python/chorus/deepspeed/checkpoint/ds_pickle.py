"""Reading DeepSpeed's .pt checkpoint files without trusting them: torch.load through an
unpickler that builds tensors, containers and numbers, and in place of DeepSpeed's own
classes (its loss scaler, ZeroStageEnum, fragment_address) inert records of what was
stored. Any other global a file names is refused, naming it, so a file cannot make the
load run code (torch's weights_only does the same for plain tensors, but refuses
DeepSpeed's classes, which every DeepSpeed checkpoint holds)."""
import collections
import concurrent.futures
import io
import os
import pickle
import zipfile
import zlib

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


class Unpickler(pickle._Unpickler):  # (the Python one, whose opcodes can be overridden)
    dispatch = dict(pickle._Unpickler.dispatch)

    def load_build(self):
        """BUILD sets the state of DeepSpeed's records and the attributes of an OrderedDict (a
        state_dict's _metadata) only: a tensor's would reach Tensor.set_."""
        if not isinstance(self.stack[-2], (Record, collections.OrderedDict)):
            raise pickle.UnpicklingError(f"DeepSpeed checkpoint: the file sets the state of a "
                                         f"{type(self.stack[-2]).__name__}; refused")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build

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
    """A view of the storage, which must lie inside it and hold no more elements than it (a
    stride-0 view of one element could otherwise stand for any number of them)."""
    size, stride, offset = tuple(int(x) for x in size), tuple(int(x) for x in stride), int(offset)
    numel = 1
    for n in size:
        numel *= n
    last = offset + sum((n - 1) * st for n, st in zip(size, stride)) if numel else offset - 1
    if len(size) != len(stride) or offset < 0 or min(size + stride, default=0) < 0 or numel > storage.numel() or \
            last >= storage.numel():
        raise pickle.UnpicklingError(f"DeepSpeed checkpoint: a tensor of size {size}, stride {stride} at {offset} "
                                     f"does not lie inside its storage of {storage.numel()} elements")
    return storage.as_strided(size, stride, offset)


class _Storage:
    def __init__(self, dtype):
        self.dtype = dtype


_PIECE = 32 << 20


def _read_member(f, member, numel, dtype, where, checker, checks):
    """A stored (uncompressed) member read straight into a new tensor, its CRC-32 checked
    (torch.save's members lie uncompressed after their local header)."""
    out = torch.empty(numel, dtype=dtype)
    if not numel:
        return out
    f.seek(member.header_offset)
    header = f.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ValueError(f"DeepSpeed checkpoint: {where}: no local header where the zip index says; truncated "
                         "or altered")
    start = member.header_offset + 30 + int.from_bytes(header[26:28], "little") + \
        int.from_bytes(header[28:30], "little")
    view = memoryview(out.view(torch.uint8).numpy())
    f.seek(start)
    crc = [0]

    def fold(piece):  # (the checker's one thread runs these in order: a running CRC)
        crc[0] = zlib.crc32(piece, crc[0])
        return crc[0]

    done = None
    for at in range(0, view.nbytes, _PIECE):  # each piece's CRC beside the next piece's read
        piece = view[at:at + _PIECE]
        got = f.readinto(piece)
        if got != piece.nbytes:
            raise ValueError(f"DeepSpeed checkpoint: {where} holds {at + got} bytes, not {view.nbytes}: truncated")
        done = checker.submit(fold, piece)
    checks.append((done, member.CRC, where))
    return out


def loads_plain(data, where):
    """A plain pickle (no tensors) through the same allowlist: containers, numbers, strings."""
    try:
        return Unpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise ValueError(f"{where}: {e}") from None


def load(path):
    """A DeepSpeed .pt file (torch's zip format) read on the CPU through the unpickler above,
    its storages read here (torch.load would let the file choose its unpickler's classes)."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"DeepSpeed checkpoint: {path} is not a torch zip file ({e})") from None
    with archive, open(path, "rb") as raw_file:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise ValueError(f"DeepSpeed checkpoint: {path} has no single data.pkl (truncated or not torch.save's)")
        prefix = pkl[0][:-len("data.pkl")]
        # torch.save stores its members uncompressed: so no member is larger here than in the file.
        packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        if packed:
            raise ValueError(f"DeepSpeed checkpoint: {path} has compressed members ({packed[:3]}); torch.save "
                             "writes none")
        loaded, budget, size = {}, [0], os.fstat(raw_file.fileno()).st_size

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
                    item = torch.empty(0, dtype=dtype).element_size()
                    try:
                        member = archive.getinfo(f"{prefix}data/{key}")
                    except KeyError:
                        raise ValueError(f"DeepSpeed checkpoint: {path}: storage {key} is missing") from None
                    if member.file_size != numel * item:
                        raise ValueError(f"DeepSpeed checkpoint: {path}: storage {key} holds {member.file_size} "
                                         f"bytes, not {numel * item}: truncated or altered")
                    # Every storage's bytes lie in the file, once: the file bounds what it makes us allocate.
                    budget[0] += numel * item
                    if budget[0] > size or member.header_offset + numel * item > size:
                        raise ValueError(f"DeepSpeed checkpoint: {path}: its storages would hold {budget[0]} bytes, "
                                         f"more than the file's {size}: truncated or altered")
                    loaded[key] = _read_member(raw_file, member, numel, dtype, f"{path}: storage {key}", checker,
                                               checks)
                return loaded[key]

        checks = []
        with concurrent.futures.ThreadPoolExecutor(1) as checker:  # (zlib.crc32 lets go of the GIL)
            out = _Reader(io.BytesIO(archive.read(pkl[0]))).load()
        for crc, want, where in checks:
            if crc.result() != want:
                raise ValueError(f"DeepSpeed checkpoint: {where} does not match its CRC-32: corrupted")
        return out
