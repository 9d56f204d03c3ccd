"""Writing .pt files that DeepSpeed 0.19.8 loads as its own: torch.save through a pickler
that names DeepSpeed's classes (its loss scalers, ZeroStageEnum, fragment_address) by their
module paths, as DeepSpeed's own files do, without importing DeepSpeed (under chorus,
`deepspeed` is chorus). Files are written to a private name, flushed, and renamed, so a
crash never leaves a truncated file under the final name."""
import copyreg
import os
import pickle
import types

import torch


class _DeepSpeedObject:
    """An instance of one of DeepSpeed's classes: made without its __init__ and given `state`
    (as pickle restores a plain object), or, for an enum, getattr(class, member)."""
    ds_path = None

    def __init__(self, state=None, member=None):
        self._state, self._member = state, member

    def __reduce_ex__(self, protocol):
        if self._member is not None:
            return getattr, (type(self), self._member)
        return copyreg.__newobj__, (type(self),), dict(self._state)


def _ds_class(module, name):
    return type(name, (_DeepSpeedObject,), {"ds_path": (module, name)})


_LossScaler = _ds_class("deepspeed.runtime.fp16.loss_scaler", "LossScaler")
_DynamicLossScaler = _ds_class("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler")
_ZeroStageEnum = _ds_class("deepspeed.runtime.zero.config", "ZeroStageEnum")
_FragmentAddress = _ds_class("deepspeed.utils.tensor_fragment", "fragment_address")
_STAGES = {0: "disabled", 1: "optimizer_states", 2: "gradients", 3: "weights"}


def loss_scaler(state):
    """DeepSpeed's LossScaler (state {"cur_scale", "dynamic": False}) or DynamicLossScaler."""
    return (_DynamicLossScaler if state.get("dynamic") else _LossScaler)(state=state)


def zero_stage(stage):
    return _ZeroStageEnum(member=_STAGES[stage])


def fragment_address(numel, start):
    return _FragmentAddress(state={"numel": int(numel), "start": int(start)})


class _Pickler(pickle._Pickler):  # (the Python pickler: its save_global can be overridden)
    def save_global(self, obj, name=None):
        path = obj.__dict__.get("ds_path") if isinstance(obj, type) else None
        if path is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{path[0]}\n{path[1]}\n".encode())
        self.memoize(obj)

    dispatch = dict(pickle._Pickler.dispatch)
    dispatch[type] = save_global


_PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__="chorus_ds_pickle")


def dump(obj, f):
    """torch.save(obj, f) as DeepSpeed would write it, into an open file."""
    torch.save(obj, f, pickle_module=_PICKLE_MODULE, pickle_protocol=2)


def save(obj, path):
    """torch.save(obj, path) as DeepSpeed would write it, atomically."""
    tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
