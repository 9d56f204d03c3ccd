"""deepspeed.zero.Init and GatheredParameters on chorus.

Inside Init, every module's own parameters are partitioned as soon as its
__init__ returns: each rank keeps a flat slice (param.ds_tensor) and the parameter
itself becomes an empty placeholder, so a model larger than one rank's memory can
be built. GatheredParameters brings whole values back (an allgather of the slices
over chorus) and, with modifier_rank, takes that rank's changes to every rank.
deepspeed.initialize takes such parameters one at a time into its ZeRO engine;
after that, GatheredParameters reads and writes them through the engine.
"""
import functools
import json
import os
from enum import Enum

import torch

import chorus.torch as hvd

_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full
_orig_torch_arange = torch.arange
_orig_torch_eye = torch.eye
_orig_torch_randn = torch.randn
_orig_torch_tensor = torch.tensor
_CONSTRUCTORS = ("tensor", "empty", "zeros", "ones", "full", "arange", "eye", "randn")

_next_id = [0]
_external = {}  # id(module) -> parameters registered with register_external_parameter


class ZeroParamStatus(Enum):
    AVAILABLE = 1  # whole, usable
    NOT_AVAILABLE = 2  # partitioned: only ds_tensor holds this rank's slice
    INFLIGHT = 3


def get_accelerator():
    from chorus.deepspeed.accelerator import get_accelerator as get
    return get()


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype, target_device=None):
    """torch.<constructor> as zero.Init runs it: on the target device, floating
    point tensors in the training dtype (Transformers swaps this function to keep
    torch.arange's dtype)."""

    def wrapped_fn(*args, **kwargs):
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if tensor.is_floating_point() and tensor.dtype != target_fp_dtype:
            tensor.data = tensor.data.to(target_fp_dtype)
        return tensor

    return wrapped_fn


def _config_dict(config_dict_or_path, config):
    source = config_dict_or_path if config_dict_or_path is not None else config
    if source is None:
        return {}
    if isinstance(source, (str, os.PathLike)):
        with open(source) as f:
            return json.load(f)
    if isinstance(source, dict):
        return source
    raise ValueError(f"deepspeed.zero.Init: config must be a dict or a JSON file path, not {type(source).__name__}")


def _enabled_section(cfg, key):
    section = cfg.get(key) or {}
    return section.get("enabled") in (True, "true", "True")


def _process_set_of(group):
    if group is None:
        return hvd.global_process_set
    if isinstance(group, hvd.ProcessSet):
        return group
    raise ValueError("deepspeed.zero.Init: data_parallel_group must be None (every rank) or a chorus ProcessSet")


def _shard_numel(param):
    return -(-param.ds_numel // param.ds_process_set.size())


def _new_id():
    _next_id[0] += 1
    return _next_id[0] - 1


def _engine_of(param):
    ref = getattr(param, "_chorus_engine_ref", None)
    return ref() if ref is not None else None


class _Staging:
    """Init(remote_device="nvme"): the slices of a model being built, in a file under
    offload_param's nvme_path until deepspeed.initialize takes them (one at a time) into its
    engine, so the model never exists whole in memory. The file is unlinked once open:
    scratch for this process only."""

    def __init__(self, folder):
        import tempfile
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="chorus-init-", dir=folder)
        os.unlink(path)
        self.fd, self.folder, self.end = fd, folder, 0

    def put(self, tensor, at=None):
        """Writes tensor's bytes (at `at`, its earlier place, else at the end); returns where."""
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        if at is None:
            at, self.end = self.end, self.end + raw.nbytes
        done = 0
        while done < raw.nbytes:
            try:
                done += os.pwrite(self.fd, raw[done:], at + done)
            except OSError as e:
                raise OSError(e.errno, f"deepspeed.zero.Init(remote_device='nvme'): cannot write a parameter's "
                                       f"slice to nvme_path {self.folder!r}: {e.strerror}") from None
        return at

    def get(self, at, numel, dtype):
        out = torch.empty(numel, dtype=dtype)
        raw = out.view(torch.uint8).numpy()
        done = 0
        while done < raw.nbytes:
            n = os.preadv(self.fd, [raw[done:]], at + done)
            if n <= 0:
                raise OSError(f"deepspeed.zero.Init(remote_device='nvme'): a parameter's slice in nvme_path "
                              f"{self.folder!r} is cut short")
            done += n
        return out

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, AttributeError, TypeError):
            pass


def _slice(param):
    """This rank's slice of a parameter partitioned by Init (read back when staged on disk)."""
    staged = getattr(param, "ds_staged", None)
    if staged is None:
        return param.ds_tensor
    staging, at = staged
    return staging.get(at, _shard_numel(param), param.dtype)


def _convert(param, process_set, staging=None):
    """Makes param a ZeRO-3 parameter: this rank's slice (of the set's first rank's
    values, as DeepSpeed broadcasts them) in ds_tensor (or, with staging, in its file), an
    empty placeholder as its data."""
    if hasattr(param, "ds_id"):
        return
    if process_set.size() > 1:
        root = process_set.ranks[0] if process_set.ranks else 0
        hvd.broadcast_(param.data, root_rank=root, name=f"zero.init.{_next_id[0]}", process_set=process_set)
    param.ds_id = _new_id()
    param.ds_shape = param.shape
    param.ds_numel = param.numel()
    param.ds_process_set = process_set
    param.ds_persist = False
    param.ds_active_sub_modules = set()
    param.ds_status = ZeroParamStatus.AVAILABLE
    param.partition_numel = functools.partial(_shard_numel, param)
    param.all_gather = functools.partial(_gather_one, param)
    param.partition = functools.partial(_partition_one, param)
    param.ds_staging = staging
    _partition_one(param)


def _partition_one(param, has_been_updated=False):
    if param.ds_status == ZeroParamStatus.NOT_AVAILABLE:
        return
    if _engine_of(param) is None:
        s, r = _shard_numel(param), param.ds_process_set.rank()
        flat = param.data.reshape(-1)
        part = torch.zeros(s, dtype=param.dtype, device=param.device)
        mine = flat[r * s:min((r + 1) * s, param.ds_numel)]
        part[:mine.numel()] = mine
        staging = getattr(param, "ds_staging", None)
        if staging is None:
            param.ds_tensor = part
        else:  # (written over its earlier place when GatheredParameters changed it)
            earlier = getattr(param, "ds_staged", None)
            param.ds_staged = (staging, staging.put(part, earlier[1] if earlier else None))
            param.ds_tensor = torch.empty(0, dtype=param.dtype, device=param.device)
    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    param.ds_status = ZeroParamStatus.NOT_AVAILABLE


def _gather_one(param):
    if param.ds_status == ZeroParamStatus.AVAILABLE and _engine_of(param) is None:
        return
    engine = _engine_of(param)
    if engine is not None:
        param.data = engine._zero_gather(param)
    else:
        ps = param.ds_process_set
        whole = hvd.allgather(_slice(param).reshape(1, -1), name=f"zero.gather.{param.ds_id}", process_set=ps)
        param.data = whole.reshape(-1)[:param.ds_numel].reshape(param.ds_shape).clone()
    param.ds_status = ZeroParamStatus.AVAILABLE


def _release_one(param, modifier_rank):
    engine = _engine_of(param)
    if modifier_rank is not None:
        ps = param.ds_process_set
        hvd.broadcast_(param.data, root_rank=ps.ranks[modifier_rank] if ps.ranks else modifier_rank,
                       name=f"zero.modify.{param.ds_id}", process_set=ps)
        if engine is not None:
            engine._zero_assign(param)
    if engine is not None:
        engine._zero_release(param)
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE
    elif modifier_rank is not None:
        _partition_one(param)
    else:
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE


def _all_subclasses(cls):
    out = set()
    for sub in cls.__subclasses__():
        out.add(sub)
        out |= _all_subclasses(sub)
    return out


class Init:
    """A context in which modules are built partitioned (see the module doc). Also
    usable on a built module: Init(module=model) partitions its parameters."""

    _active = 0

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 zero_param_parallel_group=None, zero_quantized_weights=False,
                 zero_quantized_nontrainable_weights=False, sequence_data_parallel_group=None, param_swapper=None):
        self.enabled = enabled
        if not enabled:
            return
        from chorus.deepspeed.comm import init_distributed
        init_distributed()
        cfg = _config_dict(config_dict_or_path, config)
        if dtype is None:
            dtype = (torch.float16 if _enabled_section(cfg, "fp16") else
                     torch.bfloat16 if _enabled_section(cfg, "bf16") or _enabled_section(cfg, "bfloat16") else
                     torch.float32)
        self.dtype = dtype
        self.process_set = _process_set_of(data_parallel_group)
        self.remote_device = remote_device
        self.staging = None
        if remote_device == "nvme":  # (as DeepSpeed: the slices go to offload_param's nvme_path)
            folder = ((cfg.get("zero_optimization") or {}).get("offload_param") or {}).get("nvme_path")
            if not folder:
                raise ValueError("deepspeed.zero.Init(remote_device='nvme') needs the config's "
                                 "zero_optimization.offload_param.nvme_path: the folder the slices go to")
            self.staging = _Staging(str(folder))
        elif remote_device is not None and not str(remote_device).startswith(("cpu", "cuda")):
            raise ValueError(f"deepspeed.zero.Init: remote_device {remote_device!r} is not one of None, "
                             f"'cpu', 'cuda' or 'nvme'")
        self._patched = {}
        if module is not None:
            for p in module.parameters():
                _convert(p, self.process_set, self.staging)

    def _partition_module(self, module):
        for p in module.parameters(recurse=False):
            _convert(p, self.process_set, self.staging)
        for p in _external.get(id(module), []):
            _convert(p, self.process_set, self.staging)

    def _wrap_init(self, cls):
        if "__init__" not in cls.__dict__ or cls in self._patched:
            return
        orig = cls.__dict__["__init__"]
        ctx = self

        @functools.wraps(orig)
        def init(module, *args, **kwargs):
            # Partition once, when the most derived __init__ returns: a subclass may still
            # change what its base classes' __init__ built.
            outermost = not module.__dict__.get("_chorus_zero_building", False)
            if outermost:
                module.__dict__["_chorus_zero_building"] = True
            try:
                orig(module, *args, **kwargs)
            finally:
                if outermost:
                    del module.__dict__["_chorus_zero_building"]
            if outermost:
                # Built on the meta device (its own parameters or its children's: skip_init
                # calls to_empty on the module it built): partitioned when storage comes.
                if any(p.is_meta for p in module.parameters()):
                    ctx._partition_after_to_empty(module)
                else:
                    ctx._partition_module(module)

        self._patched[cls] = orig
        cls.__init__ = init

    def _partition_after_to_empty(self, module):
        """A module built on the meta device (torch.nn.utils.skip_init) is partitioned
        when to_empty gives it storage."""
        orig, ctx = module.to_empty, self

        @functools.wraps(orig)
        def to_empty(*args, **kwargs):
            out = orig(*args, **kwargs)
            del module.to_empty
            for m in module.modules():
                ctx._partition_module(m)
            return out

        module.to_empty = to_empty

    @staticmethod
    def _apply_gathered(apply):
        """Module.apply as zero.Init runs it: fn sees each module's parameters whole
        (gathered), and what the set's first rank's fn wrote is partitioned back on
        every rank. Transformers 4.x initializes weights this way in post_init."""

        @functools.wraps(apply)
        def wrapped_apply(module, fn):
            if getattr(fn, "_chorus_gathers", False):
                return apply(module, fn)

            @functools.wraps(fn)
            def gathered_fn(m):
                params = sorted((p for p in m.parameters(recurse=False) if hasattr(p, "ds_id")),
                                key=lambda p: p.ds_id)
                with GatheredParameters(params, modifier_rank=0):
                    fn(m)

            gathered_fn._chorus_gathers = True
            return apply(module, gathered_fn)

        return wrapped_apply

    def __enter__(self):
        if not self.enabled:
            return self
        Init._active += 1
        for cls in _all_subclasses(torch.nn.Module):
            self._wrap_init(cls)
        ctx = self
        self._orig_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        @classmethod
        def init_subclass(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap_init(cls)

        torch.nn.Module.__init_subclass__ = init_subclass
        self._orig_apply = torch.nn.Module.apply
        torch.nn.Module.apply = self._apply_gathered(self._orig_apply)
        device = torch.device(get_accelerator().current_device_name())
        self._constructors = {}
        for name in _CONSTRUCTORS:
            self._constructors[name] = getattr(torch, name)
            setattr(torch, name, zero_wrapper_for_fp_tensor_constructor(
                globals()["_orig_torch_" + name], self.dtype, target_device=device))
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, orig in self._patched.items():
            cls.__init__ = orig
        self._patched.clear()
        if self._orig_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._orig_init_subclass
        torch.nn.Module.apply = self._orig_apply
        for name, fn in self._constructors.items():
            setattr(torch, name, fn)
        Init._active -= 1
        return False


class GatheredParameters:
    """Whole values of ZeRO-3 parameters inside the block; with modifier_rank, that
    rank's changes reach every rank at the end (collective over the parameters'
    process set). Parameters that are not partitioned pass through untouched."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.nn.Parameter) or torch.is_tensor(params):
            params = [params]
        seen, self.params = set(), []
        for p in params if params is not None else []:
            if hasattr(p, "ds_id") and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        self.enabled = enabled and bool(self.params)
        self.modifier_rank = modifier_rank
        self.fwd_module = fwd_module

    def __enter__(self):
        if self.enabled:
            # An engine's parameters always go through it (a persistent one is whole already).
            self._gathered = [p for p in self.params
                              if p.ds_status == ZeroParamStatus.NOT_AVAILABLE or _engine_of(p) is not None]
            for p in self._gathered:
                _gather_one(p)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            for p in self._gathered:
                _release_one(p, self.modifier_rank)
        return False


def register_external_parameter(module, parameter):
    """Tells ZeRO-3 that module's forward uses parameter, which another module owns
    (so it is gathered for module too)."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise ValueError("register_external_parameter: parameter must be a torch.nn.Parameter")
    _external.setdefault(id(module), [])
    if all(p is not parameter for p in _external[id(module)]):
        _external[id(module)].append(parameter)


def unregister_external_parameter(module, parameter):
    params = _external.get(id(module), [])
    if all(p is not parameter for p in params):
        raise ValueError("unregister_external_parameter: the parameter was not registered with this module")
    _external[id(module)] = [p for p in params if p is not parameter]


def external_parameters(module):
    return list(_external.get(id(module), []))
