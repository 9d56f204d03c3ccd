"""deepspeed.sequence.layer.DistributedAttention on 4 ranks: attention output and
the gradients of q, k and v equal full attention in one process, at
sequence-parallel 2 and 4, causal or not, sequence-first and batch-first; the
group as a chorus process set and as a torch.distributed group; bad shapes refused
on every rank. Then a small attention model under ZeRO-2 at sp 2 x dp 2 equals one
process training on the whole sequences."""
import math
import os
import warnings

import torch
import torch.distributed as dist

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.sequence.layer import DistributedAttention
from chorus.common import process_sets
from chorus.deepspeed.utils import groups

warnings.simplefilter("ignore")
deepspeed.init_distributed(dist_init_required=False)
W, R = hvd.size(), hvd.rank()
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=R, world_size=W)  # for a group from torch.distributed.new_group
S, B, H, D = 8, 2, 4, 3


def attention(causal, seq_dim):
    """Plain softmax attention on [.., s, .., h, d] with the sequence at seq_dim."""
    def run(q, k, v):
        if seq_dim == 0:  # [s, b, h, d] -> [b, h, s, d]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        else:  # [b, s, h, d]
            q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            n = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return out.permute(2, 0, 1, 3) if seq_dim == 0 else out.permute(0, 2, 1, 3)
    return run


def full(seed, seq_dim):
    g = torch.Generator().manual_seed(seed)
    shape = [S, B, H, D] if seq_dim == 0 else [B, S, H, D]
    return [torch.randn(shape, generator=g) for _ in range(4)]  # q, k, v, the loss weights


def check(sp, causal, seq_dim, group, old_api=False):
    p_rank = R % sp
    q, k, v, w = full(R // sp, seq_dim)  # one sequence per sequence-parallel set
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    ref = attention(causal, seq_dim)(q, k, v)
    (ref * w).sum().backward()
    shard = lambda t: t.detach().chunk(sp, dim=seq_dim)[p_rank].clone()  # noqa: E731
    lq, lk, lv = (shard(t).requires_grad_(True) for t in (q, k, v))
    if old_api:  # DeepSpeed < 0.15: the layout from gather_idx
        out = DistributedAttention(attention(causal, seq_dim), group, gather_idx=seq_dim)(lq, lk, lv)
    else:  # DeepSpeed >= 0.15: the default indices, the layout from batch_dim_idx
        out = DistributedAttention(attention(causal, seq_dim), group)(lq, lk, lv, 1 - seq_dim)
    what = f"sp={sp} causal={causal} seq_dim={seq_dim} old_api={old_api}"
    assert torch.allclose(out, shard(ref), atol=1e-5), f"rank {R}: output {what}"
    (out * shard(w)).sum().backward()
    for name, local, whole in (("q", lq, q), ("k", lk, k), ("v", lv, v)):
        assert torch.allclose(local.grad, shard(whole.grad), atol=1e-5), f"rank {R}: d{name} {what}"


for sp in (2, 4):
    runs = [list(range(i, i + sp)) for i in range(0, W, sp)]
    sets = [hvd.global_process_set if len(r) == W else hvd.add_process_set(r) for r in runs]
    mine = sets[R // sp]
    torch_groups = [dist.new_group(r) for r in runs]
    for causal in (False, True):
        for seq_dim in (0, 1):
            check(sp, causal, seq_dim, mine)
            check(sp, causal, seq_dim, mine, old_api=True)
    check(sp, True, 0, torch_groups[R // sp])  # a torch.distributed group maps onto chorus's set
    # Bad input: heads not divisible by the set's size, on every rank of it.
    try:
        DistributedAttention(attention(False, 0), mine)(*[torch.randn(2, B, 3 if sp == 2 else 6, D)] * 3)
        raise SystemExit("no error for heads not divisible")
    except ValueError as e:
        assert f"heads {3 if sp == 2 else 6}" in str(e) and f"sequence-parallel size {sp}" in str(e), e
print(f"ulysses attention ok rank {R}", flush=True)

# deepspeed.comm with a chorus process set (what deepspeed.utils.groups hands out) runs
# on that set, also while torch.distributed is up.
ps = [s for s in process_sets._initialized_sets if s.ranks == [R - R % 2, R - R % 2 + 1]][0]
t = torch.tensor([float(R)])
deepspeed.comm.all_reduce(t, group=ps)
assert t.item() == (R - R % 2) * 2 + 1, t
assert deepspeed.comm.get_world_size(ps) == 2 and deepspeed.comm.get_rank(ps) == R % 2
assert deepspeed.comm.get_global_rank(ps, 1) == R - R % 2 + 1
out = torch.empty(2)
deepspeed.comm.all_to_all_single(out, torch.tensor([10.0 * R, 10.0 * R + 1]), group=ps)
assert out.tolist() == [10.0 * (R - R % 2) + R % 2, 10.0 * (R - R % 2 + 1) + R % 2], out
print(f"ds comm on a process set ok rank {R}", flush=True)

# Unequal sequence slices: an error on every rank, naming the op, and the set goes on.
sp_set = hvd.global_process_set
layer = DistributedAttention(attention(False, 0), sp_set)
try:
    layer(*[torch.randn(2 + (R == 0), B, H, D)] * 3)
    raise SystemExit("no error for unequal sequence slices")
except ValueError as e:
    assert "must hold equal slices" in str(e) and "'alltoall.ulysses." in str(e) and "on ranks [0]" in str(e), e
out = layer(*[torch.randn(2, B, H, D)] * 3)
assert out.shape == (2, B, H, D)
print(f"ulysses refusal ok rank {R}", flush=True)


# Ulysses at sp 2 x dp 2 under ZeRO-2: one process on the whole sequences.
class Block(torch.nn.Module):
    def __init__(self, group):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.out = torch.nn.Linear(H * D, 5)
        self.attn = DistributedAttention(attention(True, 0), group) if group is not None else attention(True, 0)

    def forward(self, x, y):  # x [s, b, H*D]
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, H, D).unbind(2)
        h = self.attn(q, k, v).reshape(x.shape[0], x.shape[1], H * D)
        return torch.nn.functional.cross_entropy(self.out(h).reshape(-1, 5), y.reshape(-1))


def sequences(step, replica):
    g = torch.Generator().manual_seed(100 * step + replica)
    return torch.randn(S, B, H * D, generator=g), torch.randint(0, 5, (S, B), generator=g)


groups._create_sequence_parallel(2)
assert groups._get_sequence_parallel_world_size() == 2 and groups._get_sequence_parallel_rank() == R % 2
model = Block(groups._get_sequence_parallel_group())
cfg = {"train_micro_batch_size_per_gpu": B, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "eps": 1e-3}},
       "zero_optimization": {"stage": 2, "reduce_bucket_size": 60}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
ref = Block(None)
# (eps: the key bias's gradient is zero in exact arithmetic, softmax ignores a shift
# of every score, and Adam with a tiny eps turns its rounding noise into whole steps.)
opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.01, eps=1e-3)
for step in range(4):
    x, y = sequences(step, R // 2)
    mine = slice((R % 2) * S // 2, (R % 2 + 1) * S // 2)
    loss = engine(x[mine], y[mine])
    engine.backward(loss)
    engine.step()
    opt.zero_grad()
    for replica in range(2):  # each replica's two halves
        xr, yr = sequences(step, replica)
        for half in range(2):
            part = slice(half * S // 2, (half + 1) * S // 2)
            # A half's loss needs attention over the whole sequence up to it: the full pass, its rows.
            q, k, v = ref.qkv(xr).view(S, B, 3, H, D).unbind(2)
            h = ref.attn(q, k, v).reshape(S, B, H * D)[part]
            # As DeepSpeed's engine with sequence parallelism: summed over the sequence-parallel
            # ranks, averaged over the data-parallel ones.
            (torch.nn.functional.cross_entropy(ref.out(h).reshape(-1, 5), yr[part].reshape(-1)) / 2).backward()
    opt.step()
for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    assert torch.allclose(p.data, q.data, atol=2e-5, rtol=2e-4), f"rank {R}: {n} {(p.data - q.data).abs().max()}"
print(f"ulysses zero2 ok rank {R}", flush=True)
