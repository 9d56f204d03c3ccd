"""deepspeed.sequence.layer.DistributedAttention (Ulysses): each rank of the
sequence-parallel set holds a slice of the sequence; an all-to-all over the set
turns q, k and v into every position for a slice of the heads, the local
attention runs on those, and one more all-to-all turns its output back into the
rank's slice of the sequence with every head. Differentiable: the backward pass
runs the opposite all-to-alls."""
import torch

from chorus import _core
import chorus.torch as hvd
from chorus.common.process_sets import ProcessSet


def _torch_group_ranks(group):
    import torch.distributed as dist
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(group))
    from torch.distributed import distributed_c10d as c10d  # torch 1.x
    mapping = c10d._pg_group_ranks[group]
    return [g for g, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


def process_set_of(group):
    """The chorus process set for a sequence-parallel group: a ProcessSet as is; a
    torch.distributed group (from new_group) through the set over the same ranks,
    made collectively (every rank builds its attention layers together); None: the
    sequence-parallel group deepspeed.utils.groups made."""
    if isinstance(group, ProcessSet):
        return group
    from chorus.deepspeed.utils import groups
    if group is None:
        return groups._get_sequence_parallel_group()
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"DistributedAttention: sequence_process_group is a {type(group).__name__}, not a chorus "
                         "ProcessSet, and torch.distributed is not initialized")
    mine = _torch_group_ranks(group)
    from chorus.deepspeed.runtime.pipe.topology import process_set_for
    found = None
    for ranks in sorted({tuple(r) for r in hvd.allgather_object(mine, name="ulysses.groups")}):
        ps = process_set_for(list(ranks))
        if list(ranks) == sorted(mine):
            found = ps
    return found


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(t, freqs_cos, freqs_sin):
    """Rotary embedding on the first freqs.shape[-1] features of t (the rest pass)."""
    rot = freqs_cos.shape[-1]
    t, rest = t[..., :rot], t[..., rot:]
    t = t * freqs_cos + _rotate_half(t) * freqs_sin
    return t if rest.shape[-1] == 0 else torch.cat((t, rest), dim=-1)


def single_all_to_all(x, scatter_idx, gather_idx, process_set, name=None):
    """x split in the set's size along scatter_idx, piece p to rank p; what arrives
    joined along gather_idx in rank order."""
    p = process_set.size()
    if x.shape[scatter_idx] % p != 0:
        what = "heads" if scatter_idx >= 2 else "sequence length"
        raise ValueError(f"DistributedAttention: {what} {x.shape[scatter_idx]} (dimension {scatter_idx} of a "
                         f"{list(x.shape)} tensor) is not divisible by the sequence-parallel size {p}")
    if p == 1:
        return x
    pieces = torch.stack(x.chunk(p, dim=scatter_idx)).contiguous()
    try:
        arrived = hvd.alltoall(pieces, name=name, process_set=process_set)
    except _core.MismatchError as e:  # shapes that differ between the ranks
        raise ValueError(f"DistributedAttention: the ranks of the sequence-parallel set must hold equal slices "
                         f"(the sequence length divisible by {p}, every other dimension alike): {e}") from e
    return torch.cat(arrived.unbind(0), dim=gather_idx)


class DistributedAttention(torch.nn.Module):
    """local_attention(q, k, v, *args, **kwargs) over the whole sequence for a slice
    of the heads. forward(query, key, value[, batch_dim_idx[, rotary_pos_emb]], *args,
    **kwargs) takes this rank's slice of the sequence and returns the attention
    output for that slice, every head: [s/p, b, h, d] (batch_dim_idx=1, or the
    default scatter_idx=2, gather_idx=0 when no batch_dim_idx is given) or
    [b, s/p, h, d] (batch_dim_idx=0, or gather_idx=1)."""

    _made = {}  # process set id: layers numbered on it so far

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=0, sp_stream=None,
                 num_kv_heads=None):
        super().__init__()
        self.local_attn = local_attention
        self.spg = process_set_of(sequence_process_group)
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.sp_stream = sp_stream  # chorus's all-to-alls run on its own threads; no stream to overlap on
        self.num_kv_heads = num_kv_heads
        self._name = None

    def forward(self, query, key, value, *args, **kwargs):
        batch_dim_idx = kwargs.pop("batch_dim_idx", None)
        rotary = kwargs.pop("rotary_pos_emb", None)
        if args and type(args[0]) is int and args[0] in (0, 1):  # DeepSpeed >= 0.15: batch_dim_idx, rotary_pos_emb
            batch_dim_idx, args = args[0], args[1:]
            if args and (args[0] is None or isinstance(args[0], (tuple, list))):
                rotary, args = args[0], args[1:]
        # DeepSpeed >= 0.15 takes the layout from batch_dim_idx: the sequence is the other
        # of the first two dimensions (gather_idx is what older versions went by).
        gather = self.gather_idx if batch_dim_idx is None else 1 - batch_dim_idx
        if self._name is None:  # numbered at the first call, in the order the set's ranks run their layers
            number = DistributedAttention._made.get(self.spg.process_set_id, 0) + 1
            DistributedAttention._made[self.spg.process_set_id] = number
            self._name = f"ulysses.{self.spg.process_set_id}.{number}"
        if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
            raise ValueError(f"DistributedAttention: query {list(query.shape)}, key {list(key.shape)} and value "
                             f"{list(value.shape)} must agree in every dimension but the last two")
        q = single_all_to_all(query, self.scatter_idx, gather, self.spg, f"{self._name}.q")
        k = single_all_to_all(key, self.scatter_idx, gather, self.spg, f"{self._name}.k")
        v = single_all_to_all(value, self.scatter_idx, gather, self.spg, f"{self._name}.v")
        if rotary is not None:
            cos, sin = rotary[0].permute(1, 0, 2, 3), rotary[1].permute(1, 0, 2, 3)
            q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return single_all_to_all(context, gather, self.scatter_idx, self.spg, f"{self._name}.out")
