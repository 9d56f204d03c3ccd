"""PyTorch's distributed checkpoint (torch.distributed.checkpoint, DCP), written and read by
the engine (`"checkpoint": {"format": "dcp"}`; load_checkpoint recognizes a DCP folder).

Written as torchtitan and FSDP2 code lay it out: {"model": {fqn: fp32 tensor, buffers},
"optimizer": {"state": {fqn: {"step", "exp_avg", ...}}, "param_groups": [...]}}. Each
parameter is whole in one rank's file (the ranks share them out by size), gathered a chunk at
a time; each rank writes its items with DCP's own FileSystemWriter into rank_R/, and rank 0
joins the ranks' metadata into the folder's .metadata last, so DCP's FileSystemReader,
dcp.load (at any world size and sharding) and dcp_to_torch_save read it. The engine's
counters, LR scheduler and client state go beside it in chorus_state.chorus.

Read: any DCP folder whose tensors are named as the model's parameters, under "model." or
at the top level (dcp.save(model.state_dict())), with the optimizer's state under
"optimizer.state.<fqn>." when present; each rank reads whole parameters a chunk at a time
through DCP's reader (so any sharding it was written with) and keeps its pieces. The
.metadata is unpickled through an allowlist of DCP's own classes (DCP's reader unpickles it
whole); tensors through torch.load(weights_only=True), as DCP reads them; the optimizer's
param_groups (pickled values) are not read: the engine's settings stay."""
import os
import pickle

import torch

from chorus.deepspeed.checkpoint import ds_writer

METADATA = ".metadata"
CHORUS_STATE = "chorus_state.chorus"
CLIENT_STATE = "chorus_client_state.pt"


def _require():
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: F401 (present?)
        from torch.distributed.checkpoint.metadata import Metadata  # noqa: F401
    except ImportError as e:
        raise ValueError(f"checkpoint.format \"dcp\" needs torch.distributed.checkpoint (torch 2.2 or later); "
                         f"this torch {torch.__version__} has none ({e})") from None
    import inspect
    if not hasattr(dcp, "save") or "no_dist" not in inspect.signature(dcp.save).parameters:
        raise ValueError(f"checkpoint.format \"dcp\" needs torch 2.2 or later (dcp.save(no_dist=)); this is "
                         f"{torch.__version__}")
    return dcp


def _quiet():
    """DCP warns that it runs in one process (no_dist): each rank's part is one process's, by design."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def quiet():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            yield
    return quiet()


def is_dcp_checkpoint(path):
    return os.path.isfile(os.path.join(path, METADATA))


# --- the metadata, unpickled through an allowlist ---------------------------------------------
def _allowed():
    import pathlib
    from torch.distributed.checkpoint import filesystem, metadata
    names = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
             "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
    out = {("torch.distributed.checkpoint.metadata", n): getattr(metadata, n) for n in names
           if hasattr(metadata, n)}
    out[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = filesystem._StorageInfo
    out[("torch", "Size")] = torch.Size
    out[("pathlib", "PosixPath")] = pathlib.PosixPath
    out[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    return out


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f, where):
        super().__init__(f)
        self.where, self.allowed = where, _allowed()

    def find_class(self, module, name):
        if (module, name) in self.allowed:
            return self.allowed[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format)):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return lambda n: {"torch.strided": torch.strided, "torch.sparse_coo": torch.sparse_coo}[n]
        if (module, name) in (("builtins", "getattr"), ("__builtin__", "getattr")):
            enum = self.allowed.get(("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"))
            return lambda obj, attr: getattr(obj, attr) if obj is enum and not attr.startswith("_") else \
                _refuse(self.where, f"getattr({obj!r}, {attr!r})")
        _refuse(self.where, f"{module}.{name}")


def _refuse(where, what):
    raise pickle.UnpicklingError(f"DCP checkpoint {where}: its metadata names {what}, which DCP's metadata does "
                                 "not hold; refused")


def read_metadata(path):
    where = os.path.join(path, METADATA)
    with open(where, "rb") as f:
        return _MetadataUnpickler(f, where).load()


def _reader(path):
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            md = read_metadata(path)
            try:
                from torch.distributed.checkpoint.metadata import StorageMeta
                if getattr(md, "storage_meta", None) is None:
                    md.storage_meta = StorageMeta()
                md.storage_meta.load_id = self.load_id
            except (ImportError, AttributeError):
                pass
            return md

    return Reader(path)


# --- writing -----------------------------------------------------------------------------------
def owners(shapes, world):
    """Each parameter's writing rank: the largest first, to the least loaded rank."""
    load, out = [0] * world, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -ds_writer._numel(shapes[i])):
        r = min(range(world), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += ds_writer._numel(shapes[i])
    return out


def rank_dir(r):
    return f"rank_{r:05d}"


def write_rank(whole, fetch, path, rank, world):
    """This rank's DCP items (collective: every rank fetches the same chunks)."""
    dcp = _require()
    from torch.distributed.checkpoint import FileSystemWriter
    keys = whole.state_keys
    mine = owners(whole.shapes, world)
    model, state = {}, {}

    def use(i, v):
        if mine[i] == rank:
            name = whole.names[i]
            model[name] = v["fp32"].view(whole.shapes[i]).clone()
            state[name] = {"step": torch.tensor(float(whole.step)),
                           **{k: v[k].view(whole.shapes[i]).clone() for k in keys}}

    ds_writer._fetch_all(whole, fetch, list(range(len(whole.names))), use)
    sd = {"model": model, "optimizer": {"state": state}}
    if rank == 0:
        for name, b in whole.buffers.items():
            model[name] = b.detach().cpu().clone()
        for name, t in whole.frozen.items():
            model[name] = t.detach().cpu().float().clone()
        groups = []
        for gi, idx in whole.groups():
            g = {k: (list(v) if isinstance(v, tuple) else v) for k, v in whole.hypers[gi].items()}
            if whole.kind in ("adam", "adamw"):  # torch.optim's Adam/AdamW keys, which its load_state_dict expects
                for k, v in (("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
                             ("differentiable", False), ("fused", None),
                             ("decoupled_weight_decay", whole.kind == "adamw")):
                    g.setdefault(k, v)
                g.pop("bias_correction", None)
            g["params"] = [whole.names[i] for i in idx]
            groups.append(g)
        sd["optimizer"]["param_groups"] = groups
    for alias, name in whole.shared.items():  # a tied parameter under each of its names, as state_dict()
        if name in model:
            model[alias] = model[name]
    with _quiet():
        dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(path, rank_dir(rank))), no_dist=True)


def join_metadata(path, world):
    """The ranks' metadata, as one .metadata at path (written last, atomically)."""
    import dataclasses
    merged = None
    for r in range(world):
        md = read_metadata(os.path.join(path, rank_dir(r)))
        md.storage_data = {k: dataclasses.replace(v, relative_path=f"{rank_dir(r)}/{v.relative_path}")
                           for k, v in md.storage_data.items()}
        if merged is None:
            merged = md
            continue
        clash = set(merged.state_dict_metadata) & set(md.state_dict_metadata)
        if clash:
            raise ValueError(f"DCP save {path}: ranks 0 and {r} both wrote {sorted(clash)[:3]}")
        merged.state_dict_metadata.update(md.state_dict_metadata)
        merged.storage_data.update(md.storage_data)
        if isinstance(merged.planner_data, dict) and isinstance(md.planner_data, dict):
            merged.planner_data.update(md.planner_data)
    tmp = os.path.join(path, f"{METADATA}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(merged, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, METADATA))
    for r in range(world):  # (one .metadata: the folder's)
        os.unlink(os.path.join(path, rank_dir(r), METADATA))


# --- reading -----------------------------------------------------------------------------------
class DcpCheckpoint:
    """The tensors of a DCP folder by the model's names: prefix "model." or none, optimizer
    state under "optimizer.state.<name>.<key>"."""

    def __init__(self, path, names):
        _require()
        self.path = path
        self.md = read_metadata(path)
        tensors = {k: v for k, v in self.md.state_dict_metadata.items() if hasattr(v, "size")}
        # torchtitan's {"model": ...} or the bare names (a Hugging Face model's own begin "model.")
        self.prefix = "model." if names and "model." + names[0] in tensors else ""
        self.tensors = tensors

    def shape(self, name):
        meta = self.tensors.get(self.prefix + name)
        return None if meta is None else tuple(meta.size)

    def has_state(self, name, key):
        return f"optimizer.state.{name}.{key}" in self.tensors

    def read(self, requests):
        """requests: {name: [key, ...]} ("fp32" the parameter, others optimizer state):
        {name: {key: fp32 tensor}} read through DCP's planner (any sharding)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        sd, out = {}, {}
        for name, keys in requests.items():
            out[name] = {}
            for k in keys:
                full = self.prefix + name if k == "fp32" else f"optimizer.state.{name}.{k}"
                t = torch.empty(tuple(self.tensors[full].size), dtype=torch.float32)
                sd[full] = out[name][k] = t
        with _quiet():
            dcp.load(sd, storage_reader=_reader(self.path), planner=DefaultLoadPlanner(allow_partial_load=True),
                     no_dist=True)
        return out

    def scalar(self, name):
        """A 0-dim tensor item's value (an optimizer's step), or None."""
        if name not in self.tensors or tuple(self.tensors[name].size):
            return None
        return self.read_raw(name)

    def read_raw(self, name):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        t = torch.empty((), dtype=torch.float64)
        with _quiet():
            dcp.load({name: t}, storage_reader=_reader(self.path),
                     planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
        return float(t)
