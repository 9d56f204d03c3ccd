"""Point-to-point between two ranks (pipeline stages): send/recv, isend/irecv and
torch.distributed's batch_isend_irecv/P2POp. Peers are global ranks, both in
process_set; a recv takes the first send from its peer with the same set and tag.

With autograd, send's backward receives the gradient from the peer it sent to,
and recv's (requires_grad=True) sends the gradient back to where it came from.
"""
import torch

from chorus import _core
from chorus.common.process_sets import _set_id, global_process_set
from chorus.torch.handles import (_device_args, _dtype_code, _is_copy, _ordered, _register, _run_now, _stage, _start,
                                  _waits_now, poll, synchronize)


class P2PWork:
    """An op in flight: wait() (rethrows its error), is_completed(); hvd.synchronize and hvd.poll take it too."""
    __slots__ = ("handle", "_waited", "_result")

    def __init__(self, handle):
        self.handle = handle
        self._waited = False
        self._result = None

    def wait(self):
        if not self._waited:
            self._result = synchronize(self.handle)
            self._waited = True
        return self._result

    def is_completed(self):
        return self._waited or poll(self.handle)


def _send_async(tensor, dst, tag, process_set):
    staged = _stage(tensor)
    work = _start((staged,), _core.send_async, staged.data_ptr(), _dtype_code(staged, "send"), list(staged.shape),
                  int(dst), int(tag), _set_id(process_set), _waits_now(), **_device_args([staged], "send"))
    return _register(work, (tensor, staged), lambda: None)


def _recv_async(tensor, src, tag, process_set):
    staged = _stage(tensor)
    work = _start((staged,), _core.recv_async, staged.data_ptr(), _dtype_code(staged, "recv"), list(staged.shape),
                  int(src), int(tag), _set_id(process_set), _waits_now(), **_device_args([staged], "recv"))

    def finish():
        _ordered(work, [staged])
        if _is_copy(staged, tensor):
            tensor.data.copy_(staged)
        return tensor
    return _register(work, (tensor, staged), finish)


def isend(tensor, dst, tag=0, process_set=global_process_set):
    """Starts sending tensor to global rank dst; the tensor must not change until the op is done."""
    return P2PWork(_send_async(tensor, dst, tag, process_set))


def irecv(tensor, src, tag=0, process_set=global_process_set):
    """Starts receiving into tensor from global rank src."""
    return P2PWork(_recv_async(tensor, src, tag, process_set))


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dst, tag, process_set):
        ctx.dst, ctx.tag, ctx.process_set = dst, tag, process_set
        ctx.shape, ctx.dtype, ctx.device = tensor.shape, tensor.dtype, tensor.device
        _run_now(_send_async, tensor.detach(), dst, tag, process_set)
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
        _run_now(_recv_async, grad, ctx.dst, ctx.tag, ctx.process_set)
        return grad, None, None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, like, src, tag, process_set):
        ctx.src, ctx.tag, ctx.process_set = src, tag, process_set
        out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        _run_now(_recv_async, out, src, tag, process_set)
        return out

    @staticmethod
    def backward(ctx, grad):
        _run_now(_send_async, grad.contiguous(), ctx.src, ctx.tag, ctx.process_set)
        return None, None, None, None, None


def send(tensor, dst, tag=0, process_set=global_process_set):
    """Sends tensor to global rank dst and returns once the receiver has it.

    When autograd records tensor, returns a scalar token: token.backward()
    receives tensor's gradient from dst (which sent it back from its recv) and
    carries it into tensor's graph. Otherwise returns None."""
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _Send.apply(tensor, dst, tag, process_set)
    _run_now(_send_async, tensor, dst, tag, process_set)
    return None


def recv(tensor, src, tag=0, process_set=global_process_set, requires_grad=False):
    """Receives into tensor from global rank src and returns it.

    requires_grad=True: returns a new tensor (of tensor's shape and dtype) that
    autograd records; its gradient goes back to src in the backward pass."""
    if requires_grad:
        return _Recv.apply(torch.empty(0, requires_grad=True), tensor, src, tag, process_set)
    return _run_now(_recv_async, tensor, src, tag, process_set)


class P2POp:
    """One op of batch_isend_irecv, as torch.distributed.P2POp: op is isend or irecv."""

    def __init__(self, op, tensor, peer, tag=0):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be chorus.torch.isend or chorus.torch.irecv")
        self.op, self.tensor, self.peer, self.tag = op, tensor, int(peer), int(tag)


def batch_isend_irecv(p2p_op_list, process_set=global_process_set):
    """Posts every op at once (sends and receives in any order cannot deadlock)
    and returns their P2PWork objects, in order."""
    staged = [_stage(op.tensor) for op in p2p_op_list]
    works = _core.batch_send_recv([op.op is isend for op in p2p_op_list], [s.data_ptr() for s in staged],
                                  [_dtype_code(s, "batch_isend_irecv") for s in staged], [list(s.shape) for s in staged],
                                  [op.peer for op in p2p_op_list], [op.tag for op in p2p_op_list], _set_id(process_set),
                                  **_device_args(staged, "batch_isend_irecv"))
    out = []
    for op, s, work in zip(p2p_op_list, staged, works):
        def finish(op=op, s=s, work=work):
            _ordered(work, [s])
            if op.op is irecv and _is_copy(s, op.tensor):
                op.tensor.data.copy_(s)
            return op.tensor if op.op is irecv else None
        out.append(P2PWork(_register(work, (op.tensor, s), finish)))
    return out
