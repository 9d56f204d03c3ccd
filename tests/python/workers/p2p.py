"""Point-to-point in chorus.torch: blocking and async forms, batches, process
sets, errors on both ends, and autograd through a chain of stages checked
against the same model run in one process (float64)."""
import os

import torch

import chorus.torch as hvd

if os.environ.get("P2P_TWO_HOSTS") == "1":  # even and odd ranks on two simulated hosts
    rank_env = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("CHORUS_RANK", "0"))
    os.environ["CHORUS_HOSTNAME"] = f"host{int(rank_env) % 2}"
hvd.init(process_sets="dynamic")
r, n = hvd.rank(), hvd.size()
nxt, prv = (r + 1) % n, (r - 1) % n


def message(src, numel, dtype):
    return (torch.arange(numel, dtype=torch.float64) % 97 + src * 100).to(dtype)


# A ring of blocking calls (even ranks send first, so that announced sizes cannot wait on each other).
for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
    for numel in (0, 1, 5000, 300000):
        out = message(r, numel, dtype)
        got = torch.zeros(numel, dtype=dtype)
        if r % 2 == 0:
            hvd.send(out, nxt, tag=1)
            hvd.recv(got, prv, tag=1)
        else:
            hvd.recv(got, prv, tag=1)
            hvd.send(out, nxt, tag=1)
        assert torch.equal(got, message(prv, numel, dtype)), (dtype, numel)

# isend/irecv and a batch both ways; a non-contiguous tensor is staged and copied back.
big = torch.full((512, 300), float(r))
recv_big = torch.zeros(300, 512).t()  # not contiguous
works = hvd.batch_isend_irecv([hvd.P2POp(hvd.isend, big, nxt, 3), hvd.P2POp(hvd.irecv, recv_big, prv, 3)])
for w in works:
    w.wait()
assert torch.equal(recv_big, torch.full((512, 300), float(prv)))
h = hvd.irecv(torch.zeros(4), prv, tag=9)
s = hvd.isend(torch.arange(4.0) + r, nxt, tag=9)
hvd.synchronize(s)
assert torch.equal(h.wait(), torch.arange(4.0) + prv) and h.is_completed()

# Within a process set of the even ranks (peers are global ranks).
evens = hvd.add_process_set(list(range(0, n, 2)))
if n >= 3 and r in (0, 2):
    peer = 2 - r
    buf = torch.zeros(3)
    works = hvd.batch_isend_irecv([hvd.P2POp(hvd.irecv, buf, peer), hvd.P2POp(hvd.isend, torch.full((3,), r + 0.5), peer)],
                                  process_set=evens)
    [w.wait() for w in works]
    assert torch.equal(buf, torch.full((3,), peer + 0.5))
if r == 1 and n >= 3:
    try:
        hvd.send(torch.zeros(1), 0, process_set=evens)
        raise SystemExit("a rank outside the set could send in it")
    except ValueError as e:
        assert "is not in process set" in str(e), e
hvd.barrier()
hvd.remove_process_set(evens)

# Mismatched sizes: both ends raise, naming both ranks.
if r < 2:
    try:
        if r == 0:
            hvd.send(torch.zeros(6), 1, tag=4)
        else:
            hvd.recv(torch.zeros(8), 0, tag=4)
        raise SystemExit("a mismatch went unnoticed")
    except hvd.MismatchError as e:
        assert "rank 0 sends 24 bytes (float32) with tag 4" in str(e) and "rank 1, which receives 32 bytes" in str(e), e
hvd.barrier()

# Autograd through a chain of stages 0 -> 1 -> ... -> n-1: stage k is tanh(W_k x).
torch.manual_seed(0)
weights = [torch.randn(6, 6, dtype=torch.float64) * 0.5 for _ in range(n)]
x0 = torch.randn(4, 6, dtype=torch.float64)
ref = [w.clone().requires_grad_() for w in weights]
h_ref = x0
for w in ref:
    h_ref = torch.tanh(h_ref @ w)
h_ref.pow(2).sum().backward()

mine = weights[r].clone().requires_grad_()
if r == 0:
    inp = x0
else:
    inp = hvd.recv(torch.empty(4, 6, dtype=torch.float64), r - 1, tag=20, requires_grad=True)
act = torch.tanh(inp @ mine)
if r == n - 1:
    act.pow(2).sum().backward()
else:
    token = hvd.send(act, r + 1, tag=20)
    token.backward()
assert torch.allclose(mine.grad, ref[r].grad, rtol=1e-12, atol=1e-14), (mine.grad, ref[r].grad)
hvd.barrier()
print(f"rank {r}: p2p ok", flush=True)
hvd.shutdown()
