"""Collectives on torch tensors, with horovod.torch's names, arguments and semantics.

CPU and CUDA tensors are handed to the C++ runtime by pointer (no copies): for
a CUDA tensor chorus's stream waits for the current stream on the GPU, and
synchronize() makes the current stream wait for chorus's results (the host is
not held). Tensors on other devices are staged through a CPU copy; tensors
that are not contiguous through a contiguous copy on their device. Every input
and output is kept alive until its op completes.
"""
import itertools
import threading

import torch

from chorus import _core
from chorus.common import basics as _basics  # noqa: F401 (hvd.mpi_ops._basics, as Horovod has it)
from chorus.common.basics import rank
from chorus.common.process_sets import _set_id, global_process_set
from chorus.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (hvd.Sum...)
from chorus.common.reduce_ops import resolve_op as _resolve_op
from chorus.torch.compression import Compression

HorovodInternalError = _core.HorovodInternalError
MismatchError = _core.MismatchError

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


def _call(function, tensors, *args):
    """function.apply(*args) when autograd must record the op on tensors; else the
    op alone, function.run(*args) (the Function costs ~10% of a small op)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return function.apply(*args)
    return function.run(*args)


def _name(name, kind):
    """Horovod's op name: the kind, then the caller's name ("allreduce.fc1.weight");
    empty for an automatic name (the core's "allreduce.noname.N")."""
    return "" if name is None else f"{kind}.{name}"


# ---- allreduce ----

def _new_output(like):
    """A tensor like `like`; large ones in memory the other local ranks write into directly."""
    nbytes = like.numel() * like.element_size()
    if nbytes < _core.SHARED_MIN_BYTES or like.is_cuda:
        return torch.empty_like(like)
    raw = torch.from_numpy(_core.shared_buffer(nbytes))  # keeps the buffer alive
    return raw.view(like.dtype).reshape(like.shape)


def _grouped_allreduce_async(tensors, name, op, prescale_factor, postscale_factor, process_set, priority,
                             inplace):
    staged = [_stage(t) for t in tensors]
    outs = staged if inplace else [_new_output(s) for s in staged]
    codes = [_dtype_code(t, "allreduce") for t in staged]
    work = _start((staged, outs), _core.grouped_allreduce_async,
        [t.data_ptr() for t in staged], [o.data_ptr() for o in outs], codes,
        [list(t.shape) for t in staged], _name(name, "allreduce"), op, float(prescale_factor),
        float(postscale_factor), _set_id(process_set), int(priority), _waits_now(),
        **_device_args(staged, "allreduce"))

    def finish():
        _ordered(work, staged)
        results = []
        for t, s, o in zip(tensors, staged, outs):
            if inplace:
                if _is_copy(s, t):
                    t.data.copy_(s)
                results.append(t)
            else:
                results.append(o.to(t.device) if t.device.type != "cpu" else o)
        return results
    return _register(work, (tensors, staged, outs), finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, priority=0):
    """Starts an allreduce into a new tensor; returns a handle for synchronize()."""
    op = _resolve_op(op, average, "allreduce")
    h = _grouped_allreduce_async([tensor], name, op, prescale_factor, postscale_factor, process_set,
                                 priority, inplace=False)
    return _first_result(h)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, priority=0):
    """Starts an in-place allreduce; returns a handle for synchronize()."""
    op = _resolve_op(op, average, "allreduce")
    h = _grouped_allreduce_async([tensor], name, op, prescale_factor, postscale_factor, process_set,
                                 priority, inplace=True)
    return _first_result(h)


def _first(finish):
    return lambda: finish()[0]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set, priority=0):
    op = _resolve_op(op, average, "grouped_allreduce")
    return _grouped_allreduce_async(list(tensors), name, op, prescale_factor, postscale_factor,
                                    process_set, priority, inplace=False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set, priority=0):
    op = _resolve_op(op, average, "grouped_allreduce")
    return _grouped_allreduce_async(list(tensors), name, op, prescale_factor, postscale_factor,
                                    process_set, priority, inplace=True)


def _at_once_ok(tensor):
    """Whether a synchronous allreduce of tensor can skip handles and autograd:
    a contiguous CPU tensor that autograd does not record."""
    return tensor.is_cpu and tensor.is_contiguous() and not (tensor.requires_grad and torch.is_grad_enabled())


def _allreduce_now(tensor, out, name, op, prescale_factor, postscale_factor, process_set, priority):
    _start((tensor, out), _core.allreduce_now, tensor.data_ptr(), out.data_ptr(), _dtype_code(tensor, "allreduce"),
           tensor.shape, _name(name, "allreduce"), op, float(prescale_factor), float(postscale_factor),
           _set_id(process_set), int(priority))
    return out


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, priority=0):
    if _at_once_ok(tensor):  # one core call: an 8 B op from Python took twice as long via a handle
        return _allreduce_now(tensor, tensor, name, _resolve_op(op, average, "allreduce"), prescale_factor,
                              postscale_factor, process_set, priority)
    return _run_now(allreduce_async_, tensor, average, name, op, prescale_factor,
                    postscale_factor, process_set, priority)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, priority=0):
    return _run_now(grouped_allreduce_async_, tensors, average, name, op, prescale_factor,
                    postscale_factor, process_set, priority)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def run(tensor, name, op, prescale_factor, postscale_factor, process_set, priority):
        return _run_now(allreduce_async, tensor, None, name, op, prescale_factor,
                        postscale_factor, process_set, priority)

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set, priority):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _Allreduce.run(tensor, name, op, prescale_factor, postscale_factor, process_set, priority)

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, ps = ctx.args
        grad = _run_now(allreduce_async, grad_output.contiguous(), None, None, op, pre, post, ps)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, priority=0):
    """Reduces tensor over the process set and returns the result (differentiable)."""
    op = _resolve_op(op, average, "allreduce")
    if compression is Compression.none and _at_once_ok(tensor):
        return _allreduce_now(tensor, _new_output(tensor), name, op, prescale_factor, postscale_factor,
                              process_set, priority)
    compressed, cctx = compression.compress(tensor)
    summed = _call(_Allreduce, [compressed], compressed, name, op, prescale_factor, postscale_factor,
                   process_set, priority)
    return compression.decompress(summed, cctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def run(name, op, prescale_factor, postscale_factor, process_set, priority, *tensors):
        return tuple(_run_now(grouped_allreduce_async, list(tensors), None, name, op, prescale_factor,
                              postscale_factor, process_set, priority))

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, priority, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _GroupedAllreduce.run(name, op, prescale_factor, postscale_factor, process_set, priority,
                                     *tensors)

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        out = _run_now(grouped_allreduce_async, [g.contiguous() for g in grads], None, None, op,
                       pre, post, ps)
        return (None, None, None, None, None, None, *out)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      priority=0):
    """Reduces a list of tensors fused and completed together (differentiable)."""
    op = _resolve_op(op, average, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    inputs = [p[0] for p in pairs]
    out = _call(_GroupedAllreduce, inputs, name, op, prescale_factor, postscale_factor, process_set,
                priority, *inputs)
    return [compression.decompress(o, p[1]) for o, p in zip(out, pairs)]


# ---- allgather ----

def grouped_allgather_async(tensors, name=None, process_set=global_process_set, priority=0):
    staged = [_stage(t) for t in tensors]
    codes = [_dtype_code(t, "allgather") for t in staged]
    work = _start(staged, _core.grouped_allgather_async, [t.data_ptr() for t in staged], codes,
                  [list(t.shape) for t in staged], _name(name, "allgather"),
                  _set_id(process_set), int(priority), _waits_now(), **_device_args(staged, "allgather"))

    def finish():
        _ordered(work, staged)
        return [_output(work, i, t.dtype, t.device) for i, t in enumerate(tensors)]
    return _register(work, (tensors, staged), finish)


def allgather_async(tensor, name=None, process_set=global_process_set, priority=0):
    h = grouped_allgather_async([tensor], name, process_set, priority)
    return _first_result(h)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse COO tensor by gathering every rank's indices and values (the
    result is uncoalesced: entries of the same index add up when used). Returns a
    callable that waits and gives the result, as Horovod's does."""
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports op=Average and op=Sum")
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor; use allreduce_async for dense ones")
    # Rows of nnz entries, so that allgather's concatenation along the first
    # dimension joins the ranks' entries.
    indices = tensor._indices().t().contiguous()
    values = tensor._values().contiguous()
    h = grouped_allgather_async([indices, values], name=name, process_set=process_set)
    size = (process_set or global_process_set).size()

    def wait():
        all_indices, all_values = synchronize(h)
        if op == Average:
            all_values = all_values / size if all_values.is_floating_point() else all_values // size
        return torch.sparse_coo_tensor(all_indices.t(), all_values, tensor.size(), dtype=tensor.dtype)
    return wait


def _set_rank_and_size(process_set):
    ps = process_set or global_process_set
    return ps.rank(), ps.size()


class _Allgather(torch.autograd.Function):
    @staticmethod
    def run(tensor, name, process_set, priority):
        return _run_now(allgather_async, tensor, name, process_set, priority)

    @staticmethod
    def forward(ctx, tensor, name, process_set, priority):
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return _Allgather.run(tensor, name, process_set, priority)

    @staticmethod
    def backward(ctx, grad_output):
        # Every rank's output depends on every input: average the gradients, keep my rows.
        grad = _run_now(allreduce_async, grad_output.contiguous(), op=Average,
                        process_set=ctx.process_set)
        dims = _run_now(allgather_async, torch.tensor([ctx.dim], dtype=torch.int64),
                        process_set=ctx.process_set)
        r, _ = _set_rank_and_size(ctx.process_set)
        offset = int(dims[:r].sum().item())
        return grad.narrow(0, offset, ctx.dim), None, None, None


def allgather(tensor, name=None, process_set=global_process_set, priority=0):
    """Concatenates every rank's tensor along the first dimension (which may differ per rank)."""
    return _call(_Allgather, [tensor], tensor, name, process_set, priority)


def grouped_allgather(tensors, name=None, process_set=global_process_set, priority=0):
    """allgather of each tensor, in one negotiated op. Differentiable."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_GroupedAllgather.apply(name, process_set, priority, *tensors))
    return _run_now(grouped_allgather_async, tensors, name, process_set, priority)


# ---- broadcast ----

def _broadcast_async(tensor, root_rank, name, process_set, priority, inplace):
    staged = _stage(tensor)
    out = staged if inplace else torch.empty_like(staged)
    code = _dtype_code(staged, "broadcast")
    work = _start((staged, out), _core.broadcast_async, staged.data_ptr(), out.data_ptr(), code, list(staged.shape),
                  int(root_rank), _name(name, "broadcast"), _set_id(process_set), int(priority),
                  _waits_now(), **_device_args([staged], "broadcast"))

    def finish():
        _ordered(work, [staged])
        if inplace:
            if _is_copy(staged, tensor):
                tensor.data.copy_(staged)
            return tensor
        return out.to(tensor.device) if tensor.device.type != "cpu" else out
    return _register(work, (tensor, staged, out), finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set, priority=0):
    return _broadcast_async(tensor, root_rank, name, process_set, priority, inplace=False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set, priority=0):
    return _broadcast_async(tensor, root_rank, name, process_set, priority, inplace=True)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set, priority=0):
    return _run_now(broadcast_async_, tensor, root_rank, name, process_set, priority)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def run(tensor, root_rank, name, process_set, priority):
        return _run_now(broadcast_async, tensor, root_rank, name, process_set, priority)

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set, priority):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return _Broadcast.run(tensor, root_rank, name, process_set, priority)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _run_now(allreduce_async, grad_output.contiguous(), op=Average,
                        process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set, priority=0):
    """Returns root_rank's tensor on every rank (root_rank is a global rank)."""
    return _call(_Broadcast, [tensor], tensor, root_rank, name, process_set, priority)


# ---- alltoall ----

def _splits_list(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.flatten().tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set, priority=0):
    staged = _stage(tensor)
    code = _dtype_code(staged, "alltoall")
    work = _start(staged, _core.alltoall_async, staged.data_ptr(), code, list(staged.shape), _splits_list(splits),
                  _name(name, "alltoall"), _set_id(process_set), int(priority), _waits_now(),
                  **_device_args([staged], "alltoall"))

    def finish():
        _ordered(work, [staged])
        out = _output(work, 0, tensor.dtype, tensor.device)
        return out, torch.tensor(work.received_splits(), dtype=torch.int32)
    return _register(work, (tensor, staged), finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def run(tensor, splits, name, process_set, priority):
        return _run_now(alltoall_async, tensor, splits, name, process_set, priority)

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set, priority):
        out, received = _Alltoall.run(tensor, splits, name, process_set, priority)
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _):
        grad, _ = _run_now(alltoall_async, grad_output.contiguous(), ctx.received,
                           process_set=ctx.process_set)
        return grad, None, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set, priority=0):
    """Sends splits[i] rows of tensor to rank i of the set; returns what arrived
    (and, when splits is given, how many rows came from each rank)."""
    out, received = _call(_Alltoall, [tensor], tensor, splits, name, process_set, priority)
    return (out, received) if splits is not None else out


# ---- reducescatter ----

def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0, priority=0):
    if op not in (Sum, Average):
        raise NotImplementedError("reducescatter supports op=Sum and op=Average only (as Horovod)")
    staged = [_stage(t) for t in tensors]
    codes = [_dtype_code(t, "reducescatter") for t in staged]
    work = _start(staged, _core.grouped_reducescatter_async, [t.data_ptr() for t in staged], codes,
                  [list(t.shape) for t in staged], _name(name, "reducescatter"), op,
                  float(prescale_factor), float(postscale_factor),
                  _set_id(process_set), int(priority), _waits_now(), **_device_args(staged, "reducescatter"))

    def finish():
        _ordered(work, staged)
        return [_output(work, i, t.dtype, t.device) for i, t in enumerate(tensors)]
    return _register(work, (tensors, staged), finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0, priority=0):
    h = grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                    postscale_factor, priority)
    return _first_result(h)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def run(tensor, name, op, process_set, prescale_factor, postscale_factor, priority):
        return _run_now(reducescatter_async, tensor, name, op, process_set, prescale_factor,
                        postscale_factor, priority)

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor, priority):
        ctx.op = op
        ctx.process_set = process_set
        ctx.scale = prescale_factor * postscale_factor
        return _Reducescatter.run(tensor, name, op, process_set, prescale_factor, postscale_factor,
                                  priority)

    @staticmethod
    def backward(ctx, grad_output):
        return (_reducescatter_grads(ctx, [grad_output])[0],) + (None,) * 6


def _reducescatter_grads(ctx, grads):
    """Horovod's definition: a Sum's gradient scaled by the set's size, then every
    rank's gathered (an Average's gathered as it is)."""
    if ctx.op == Sum:
        n = _set_rank_and_size(ctx.process_set)[1]
        grads = [g * n for g in grads]
    return _run_now(grouped_allgather_async, [g.contiguous() for g in grads], process_set=ctx.process_set)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, priority, *tensors):
        ctx.op = op
        ctx.process_set = process_set
        return tuple(_run_now(grouped_reducescatter_async, list(tensors), name, op, process_set, prescale_factor,
                              postscale_factor, priority))

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * 6 + tuple(_reducescatter_grads(ctx, list(grads)))


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, priority, *tensors):
        ctx.dims = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(_run_now(grouped_allgather_async, list(tensors), name, process_set, priority))

    @staticmethod
    def backward(ctx, *grads):
        # As allgather's: the gradients averaged over the set, each rank keeping its own rows.
        averaged = _run_now(grouped_allreduce_async, [g.contiguous() for g in grads], op=Average,
                            process_set=ctx.process_set)
        dims = _run_now(allgather_async, torch.tensor([ctx.dims], dtype=torch.int64), process_set=ctx.process_set)
        r, _ = _set_rank_and_size(ctx.process_set)
        offsets = dims[:r].sum(0).tolist() if r else [0] * len(ctx.dims)
        return (None,) * 3 + tuple(g.narrow(0, int(o), d) for g, o, d in zip(averaged, offsets, ctx.dims))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0,
                  priority=0):
    """Reduces tensor over the set; rank i keeps the i-th block of rows (the first
    rows % size ranks get one extra row). Differentiable."""
    compressed, cctx = compression.compress(tensor)
    out = _call(_Reducescatter, [compressed], compressed, name, op, process_set, prescale_factor,
                postscale_factor, priority)
    return compression.decompress(out, cctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, priority=0):
    pairs = [compression.compress(t) for t in tensors]
    if torch.is_grad_enabled() and any(p[0].requires_grad for p in pairs):  # differentiable
        outs = list(_GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, priority,
                                                *[p[0] for p in pairs]))
    else:
        outs = _run_now(grouped_reducescatter_async, [p[0] for p in pairs], name, op, process_set,
                        prescale_factor, postscale_factor, priority)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ---- barrier and join ----

def barrier(process_set=global_process_set):
    _start(None, _core.barrier_async, _set_id(process_set), True).wait()


def join(device=-1, process_set=global_process_set):
    """Marks this rank as out of data: its peers' allreduces see zeros from it
    until every rank has joined. Returns the last rank to join."""
    work = _start(None, _core.join_async, _set_id(process_set), True)
    work.wait()
    return work.join_result()
