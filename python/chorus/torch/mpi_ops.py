"""Collectives on torch tensors, with horovod.torch's names, arguments and semantics.

CPU and CUDA tensors are handed to the C++ runtime by pointer (no copies): for
a CUDA tensor chorus's stream waits for the current stream on the GPU, and
synchronize() makes the current stream wait for chorus's results (the host is
not held). Tensors on other devices are staged through a CPU copy; tensors
that are not contiguous through a contiguous copy on their device. Every input
and output is kept alive until its op completes.
"""
import operator

import torch

from chorus import _core
from chorus.common import basics as _basics  # noqa: F401 (hvd.mpi_ops._basics, as Horovod has it)
from chorus.common.basics import rank
from chorus.common.process_sets import _set_id, global_process_set
from chorus.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (hvd.Sum...)
from chorus.common.reduce_ops import resolve_op as _resolve_op
from chorus.torch.compression import Compression
from chorus.torch.handles import (  # noqa: F401 (_DTYPES, _abandoned: callers find them here)
    _abandoned, _device_args, _dtype_code, _DTYPES, _first_result, _is_copy, _new_output, _ordered, _output,
    _register, _run_now, _stage, _start, _waits_now, poll, synchronize)

HorovodInternalError = _core.HorovodInternalError
MismatchError = _core.MismatchError

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
    """splits as a list of ints; a tensor of another dtype, or a value that is not a
    whole number, is a ValueError (as Horovod's, which takes 32-bit integers)."""
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise ValueError(f"alltoall: splits must hold integers (int32), got a {splits.dtype} tensor")
        return [int(s) for s in splits.flatten().tolist()]
    values = list(splits)
    try:
        return [operator.index(s) for s in values]  # ints, numpy ints, 0-dim integer tensors
    except TypeError:
        raise ValueError(f"alltoall: splits must hold integers, got {values}") from None


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
        ctx.name = name
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _):
        # A named op's gradient is named after it: the same name every step (the response cache hits).
        grad, _ = _run_now(alltoall_async, grad_output.contiguous(), ctx.received,
                           name=f"{ctx.name}.grad" if ctx.name else None, process_set=ctx.process_set)
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
