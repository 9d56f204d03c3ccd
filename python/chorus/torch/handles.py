"""The torch frontend's handles: tensors handed to the core (staged where they
must be), the handle registry behind poll()/synchronize(), and the outputs the
core allocated seen as torch tensors. chorus.torch.mpi_ops builds the ops on it."""
import itertools
import threading

import torch

from chorus import _core

_DTYPES = {
    torch.uint8: 0, torch.int8: 1, torch.int32: 2, torch.int64: 3, torch.float16: 4,
    torch.bfloat16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 8, torch.int16: 9,
}
if hasattr(torch, "uint16"):  # torch 2.3+
    _DTYPES[torch.uint16] = 10


def _dtype_code(tensor, where):
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{where}: dtype {tensor.dtype} is not supported (use uint8, int8, int16, "
                         "int32, int64, float16, bfloat16, float32, float64 or bool)")
    return code


def _stage(tensor):
    """A contiguous CPU or CUDA tensor holding tensor's data (tensor itself when it is one)."""
    if (tensor.is_cpu or tensor.is_cuda) and tensor.is_contiguous():
        return tensor  # only its memory is handed over
    t = tensor.detach()
    if t.device.type not in ("cpu", "cuda"):
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def _device_args(tensors, where):
    """The core's device arguments for a call's (staged) tensors: the CUDA device
    index and the current stream there, or (-1, 0) for host tensors."""
    first = tensors[0] if tensors else None
    if first is None or not first.is_cuda:
        return {}
    index = first.device.index if first.device.index is not None else torch.cuda.current_device()
    for t in tensors:
        if t.device != first.device:
            raise ValueError(f"{where}: tensors on {first.device} and {t.device} in one call; "
                             "one call's tensors must share a device")
    return {"device": index, "stream": torch.cuda.current_stream(first.device).cuda_stream}


def _ordered(work, tensors):
    """Makes the current stream wait for a CUDA op's results (a GPU-side wait)."""
    if tensors and tensors[0].is_cuda:
        work.stream_wait(torch.cuda.current_stream(tensors[0].device).cuda_stream)


class _CudaOutput:
    """A CUDA output chorus allocated, seen by torch through the CUDA array
    interface; torch keeps this object, and so the op's memory, alive."""

    def __init__(self, work, i, nbytes):
        self.work = work
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                         "data": (work.output_ptr(i), False), "strides": None,
                                         "stream": None}


def _is_copy(staged, tensor):
    """Whether _stage had to copy, so results must be copied back."""
    return staged is not tensor


class _Handle:
    __slots__ = ("work", "keep", "finish")

    def __init__(self, work, keep, finish):
        self.work = work
        self.keep = keep  # tensors that must outlive the op
        self.finish = finish


_handles = {}
_handle_ids = itertools.count(1)
_lock = threading.Lock()


# Set while a synchronous call starts its op: the op is then waited for inside
# the core call, on this thread, which runs the negotiation itself instead of
# handing it to chorus's background thread and being woken back.
_at_once = threading.local()


# Ops whose wait a signal interrupted (Ctrl-C, a handler that raised), with the
# tensors they read and write: kept until the op is done, as chorus still uses them.
_abandoned = []


def _abandon(work, keep):
    if work is None:
        return
    with _lock:
        _abandoned[:] = [(w, k) for w, k in _abandoned if not w.poll()]
        _abandoned.append((work, keep))


def _start(keep, core_call, *args):
    """Calls the core; when a waiting call was interrupted, keeps its tensors alive."""
    try:
        return core_call(*args)
    except BaseException:
        _abandon(_core.take_interrupted(), keep)
        raise


def _waits_now():
    return getattr(_at_once, "on", False)


def _run_now(start, *args, **kwargs):
    """Starts an op with start(*args, **kwargs) and returns its result."""
    _at_once.on = True
    try:
        handle = start(*args, **kwargs)
    finally:
        _at_once.on = False
    if isinstance(handle, _Handle):  # done already: the core call waited
        return handle.finish()
    return synchronize(handle)


def _register(work, keep, finish):
    """A handle id for synchronize(); under _run_now, the _Handle itself (no id,
    no lock: the registry cost more than a small op)."""
    handle = _Handle(work, keep, finish)
    if _waits_now():
        return handle
    with _lock:
        h = next(_handle_ids)
        _handles[h] = handle
    return h


def _first_result(h):
    """Makes h's result the first of the op's results."""
    entry = h if isinstance(h, _Handle) else _handles[h]
    entry.finish = _first(entry.finish)
    return h


def _output(work, i, dtype, device):
    shape = work.output_shape(i)
    if device.type == "cuda":
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        raw = torch.as_tensor(_CudaOutput(work, i, nbytes), device=device)
        return raw.view(dtype).reshape(shape)
    raw = torch.from_numpy(work.output_bytes(i))  # shares the op's storage
    out = raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype)
    return out.to(device) if device.type != "cpu" else out


def poll(handle):
    """True when the op behind handle has finished."""
    handle = getattr(handle, "handle", handle)  # a P2PWork
    with _lock:
        h = _handles.get(handle)
    if h is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return h.work.poll()


def synchronize(handle=None):
    """Waits for an op and returns its result; with no handle, waits for everything in flight."""
    handle = getattr(handle, "handle", handle)  # a P2PWork
    if handle is None:
        with _lock:
            pending = list(_handles.keys())
        first = None
        for h in pending:
            try:
                synchronize(h)
            except Exception as e:  # wait for all, then raise the first error
                first = first or e
        _core.synchronize()
        if first is not None:
            raise first
        return None
    with _lock:
        h = _handles.pop(handle, None)
    if h is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    try:
        h.work.wait()
    except BaseException:
        if not h.work.poll():  # interrupted, not failed: the op still uses h's tensors
            _abandon(h.work, h)
        raise
    return h.finish()


def _first(finish):
    return lambda: finish()[0]


def _new_output(like):
    """A tensor like `like`; large ones in memory the other local ranks write into directly."""
    nbytes = like.numel() * like.element_size()
    if nbytes < _core.SHARED_MIN_BYTES or like.is_cuda:
        return torch.empty_like(like)
    raw = torch.from_numpy(_core.shared_buffer(nbytes))  # keeps the buffer alive
    return raw.view(like.dtype).reshape(like.shape)
