"""deepspeed.moe.sharded_moe: the gate (top-1, top-2) and the layer that sends each
token to its experts over the expert-parallel process set and back.

Routing is kept as, per route k (first and second choice) and token s: the expert
(-1 when dropped), the token's place in that expert's queue, and its gate weight.
With drop_tokens each expert takes at most `capacity` tokens and the layer's
all-to-all carries [experts, capacity, model] (fixed sizes, as DeepSpeed's);
without, every routed token travels and nothing pads: the counts are shared over
the expert-parallel set and the all-to-all carries exactly the routed rows."""
import math

import torch
import torch.nn.functional as F

import chorus.torch as hvd

_uniform = {}
_gumbel = {}


def multiplicative_jitter(x, device, epsilon=1e-2):
    """x times a draw from U(1-epsilon, 1+epsilon) (the 'Jitter' noisy gate)."""
    if epsilon == 0:
        return x
    low = torch.tensor(1.0 - epsilon, device=device)
    high = torch.tensor(1.0 + epsilon, device=device)
    return x * torch.distributions.uniform.Uniform(low, high).rsample(x.shape)


def gumbel_rsample(shape, device):
    g = _gumbel.get(device)
    if g is None:
        g = _gumbel[device] = torch.distributions.gumbel.Gumbel(torch.tensor(0.0, device=device),
                                                                torch.tensor(1.0, device=device)).rsample
    return g(shape)


def _capacity(num_tokens, num_experts, capacity_factor, min_capacity):
    return max(int(math.ceil(num_tokens / num_experts * capacity_factor)), int(min_capacity))


class Routing:
    """One gate decision: expert [k, S] (-1: dropped), location [k, S], weight [k, S]
    (differentiable), capacity (None without dropping)."""

    def __init__(self, expert, location, weight, capacity):
        self.expert, self.location, self.weight, self.capacity = expert, location, weight, capacity


def _keep_first(mask, capacity):
    """The mask with each expert's tokens after its first `capacity` (in token order) removed."""
    locations = torch.cumsum(mask, dim=0) - 1
    return mask * (locations < capacity).to(mask.dtype)


def top1gating(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None, drop_tokens=True,
               use_rts=True, ep_group=None):
    """Returns (l_aux, routing, exp_counts). exp_counts and l_aux count every token's
    choice before the capacity drops it, as DeepSpeed's."""
    gates = F.softmax(logits, dim=1)
    S, E = gates.shape
    chooser = logits + gumbel_rsample(logits.shape, logits.device) if noisy_gate_policy == "RSample" else gates
    index = torch.argmax(chooser, dim=1)
    mask = F.one_hot(index, num_classes=E)
    if used_token is not None:
        mask = mask * used_token.reshape(-1, 1).to(mask.dtype)
    exp_counts = mask.sum(dim=0).detach()
    l_aux = torch.sum(gates.mean(dim=0) * mask.float().mean(dim=0)) * E
    capacity = None
    if drop_tokens:
        capacity = _capacity(S, E, capacity_factor, min_capacity)
        if S < min_capacity:
            raise ValueError(f"MoE top-1 gate: {S} tokens is fewer than min_capacity {min_capacity}; "
                             "set min_capacity lower or give more tokens")
        if use_rts:  # random token selection: a random subset of each expert's tokens is kept
            u = _uniform.get(logits.device)
            if u is None:
                u = _uniform[logits.device] = torch.distributions.uniform.Uniform(
                    torch.tensor(0.0, device=logits.device), torch.tensor(1.0, device=logits.device)).rsample
            score = mask * u(mask.shape)
            top = torch.topk(score, k=min(capacity, S), dim=0)[1]
            mask = mask * torch.zeros_like(mask).scatter_(0, top, 1)
        else:  # the first `capacity` tokens of each expert, in token order
            mask = _keep_first(mask, capacity)
    location = ((torch.cumsum(mask, dim=0) - 1) * mask).sum(dim=1)
    kept = mask.sum(dim=1) > 0
    expert = torch.where(kept, index, torch.full_like(index, -1))
    weight = (gates * mask.to(gates.dtype)).sum(dim=1)
    return l_aux, Routing(expert.unsqueeze(0), location.unsqueeze(0), weight.unsqueeze(0), capacity), exp_counts


def top2gating(logits, capacity_factor, min_capacity, drop_tokens=True, ep_group=None,
               top2_2nd_expert_sampling=True):
    """Top-2: the first choice by gate value, the second by value (or with Gumbel
    noise, top2_2nd_expert_sampling); the two weights are renormalised after drops."""
    gates = F.softmax(logits, dim=1)
    S, E = gates.shape
    index1 = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(index1, num_classes=E)
    chooser = logits + gumbel_rsample(logits.shape, logits.device) if top2_2nd_expert_sampling else logits
    index2 = torch.argmax(chooser.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(index2, num_classes=E)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)  # after every first choice
    l_aux = torch.mean(gates.mean(dim=0) * mask1.float().mean(dim=0)) * E * E
    exp_counts = (mask1 + mask2).sum(dim=0).detach()
    capacity = None
    if drop_tokens:
        capacity = _capacity(S, E, capacity_factor * 2, min_capacity)
        mask1 = mask1 * (locations1 < capacity).to(mask1.dtype)
        mask2 = mask2 * (locations2 < capacity).to(mask2.dtype)
    loc1 = (locations1 * mask1).sum(dim=1)
    loc2 = (locations2 * mask2).sum(dim=1)
    g1 = (gates * mask1.to(gates.dtype)).sum(dim=1)
    g2 = (gates * mask2.to(gates.dtype)).sum(dim=1)
    denom = torch.clamp(g1 + g2, min=torch.finfo(gates.dtype).eps)
    g1, g2 = g1 / denom, g2 / denom
    e1 = torch.where(mask1.sum(dim=1) > 0, index1, torch.full_like(index1, -1))
    e2 = torch.where(mask2.sum(dim=1) > 0, index2, torch.full_like(index2, -1))
    routing = Routing(torch.stack([e1, e2]), torch.stack([loc1, loc2]), torch.stack([g1, g2]), capacity)
    return l_aux, routing, exp_counts


def topkgating(logits, k, capacity_factor, min_capacity, drop_tokens=True, ep_group=None):
    """Top-k for k > 2, as DeepSpeed's: each expert keeps its `capacity` most probable
    routes (DeepSpeed's "probs" drop policy); the kept weights renormalised per token."""
    gates = F.softmax(logits, dim=1)
    S, E = gates.shape
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, True)
    exp_counts = mask.sum(dim=0).detach()
    l_aux = torch.mean(gates.mean(dim=0) * mask.float().mean(dim=0)) * E * E / k
    capacity = None
    if drop_tokens:
        capacity = _capacity(S, E, capacity_factor * k, min_capacity)
        chosen = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
        keep = torch.topk(chosen, k=min(capacity, S), dim=0, sorted=False)[1]
        mask = mask & torch.zeros_like(gates, dtype=torch.bool).scatter_(0, keep, True)
    locations = torch.cumsum(mask.long(), dim=0) - 1
    masked = gates * mask
    masked = masked / torch.clamp(masked.sum(dim=-1, keepdim=True), min=torch.finfo(gates.dtype).eps)
    kept = mask.gather(1, top_idx)
    expert = torch.where(kept, top_idx, torch.full_like(top_idx, -1)).t()
    location = (locations.gather(1, top_idx) * kept).t()
    weight = masked.gather(1, top_idx).t()
    return l_aux, Routing(expert, location, weight, capacity), exp_counts


class TopKGate(torch.nn.Module):
    """The gate: a bias-free Linear(model_dim, num_experts) run in fp32, then top-k routing."""

    def __init__(self, model_dim, num_experts, k=1, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=8,
                 noisy_gate_policy=None, drop_tokens=True, use_rts=True, ep_group=None, top2_2nd_expert_sampling=True):
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"MoE gate: k must be between 1 and num_experts ({num_experts}), got {k}")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise ValueError(f"MoE gate: noisy_gate_policy must be None, 'Jitter' or 'RSample', got {noisy_gate_policy!r}")
        self.wg = torch.nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = None if noisy_gate_policy == "None" else noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group

    def forward(self, input, used_token=None):
        x = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = multiplicative_jitter(x, device=input.device)
        logits = F.linear(x, self.wg.weight.float())
        cf = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1gating(logits, cf, self.min_capacity, used_token,
                              self.noisy_gate_policy if self.training else None, self.drop_tokens, self.use_rts,
                              self.ep_group)
        if self.k == 2:
            return top2gating(logits, cf, self.min_capacity, self.drop_tokens, self.ep_group,
                              self.top2_2nd_expert_sampling)
        return topkgating(logits, self.k, cf, self.min_capacity, self.drop_tokens, self.ep_group)


def _combine(rows, slot, weight, num_tokens):
    """Σ_k weight[k, s] * rows[slot[k, s]] (slot -1: nothing), in fp32."""
    padded = torch.cat([rows.float(), rows.new_zeros(1, rows.shape[1], dtype=torch.float32)])
    safe = torch.where(slot >= 0, slot, torch.full_like(slot, rows.shape[0]))
    picked = padded.index_select(0, safe.reshape(-1)).view(slot.shape[0], num_tokens, rows.shape[1])
    return (picked * weight.unsqueeze(-1)).sum(dim=0)


def _place(tokens, row, rows):
    """A [rows, M] buffer with token s at row[k, s] for each route (-1: not placed), zeros elsewhere."""
    S = tokens.shape[0]
    source = torch.full((rows + 1,), S, dtype=torch.long, device=tokens.device)  # S: the zero row below
    who = torch.arange(S, device=tokens.device).expand_as(row)
    source.scatter_(0, torch.where(row >= 0, row, torch.full_like(row, rows)).reshape(-1), who.reshape(-1))
    padded = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])
    return padded.index_select(0, source[:rows])


def _tp():
    """(tensor-parallel set, size) of the mpu deepspeed.initialize was given, (None, 1) without."""
    from chorus.deepspeed.utils import groups
    if groups.mpu is None or groups.mpu.get_model_parallel_world_size() == 1:
        return None, 1
    return groups.mpu.get_model_parallel_group(), groups.mpu.get_model_parallel_world_size()


def _gather_slots(x, ps, name):
    """[E, C/n, M] from each of the set's n ranks -> [E, C, M], joined along the slots in rank order."""
    return hvd.allgather(x.transpose(0, 1).contiguous(), name=name, process_set=ps).transpose(0, 1).contiguous()


def _my_slots(x, ps):
    n = ps.size()
    c = x.shape[1] // n
    return x.narrow(1, ps.rank() * c, c).contiguous()


class _DropTokens(torch.autograd.Function):
    """This tensor-parallel rank's share of the slots (DeepSpeed's drop_tokens): the ranks
    hold the same tokens, so each sends only its part; backward joins the parts' gradients."""

    @staticmethod
    def forward(ctx, x, ps, name):
        ctx.ps, ctx.name = ps, name
        return _my_slots(x, ps)

    @staticmethod
    def backward(ctx, grad):
        return _gather_slots(grad, ctx.ps, ctx.name + ".grad"), None, None


class _GatherTokens(torch.autograd.Function):
    """Every tensor-parallel rank's share of the slots, joined (DeepSpeed's gather_tokens)."""

    @staticmethod
    def forward(ctx, x, ps, name):
        ctx.ps = ps
        return _gather_slots(x, ps, name)

    @staticmethod
    def backward(ctx, grad):
        return _my_slots(grad, ctx.ps), None, None


class MOELayer(torch.nn.Module):
    """Gate, then dispatch to the experts over the expert-parallel set, then combine."""

    _made = {}  # expert-parallel set id: layers numbered on it so far

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts, use_tutel=False):
        super().__init__()
        self._number = None
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.use_tutel = False  # Tutel's kernels are CUDA-only; chorus's dispatch runs on either
        self.expert_tp = False  # the experts are tensor-parallel slices (enable_expert_tensor_parallelism)
        self.l_aux = None
        self.exp_counts = None
        self.wall_clock_breakdown = False
        self.time_falltoall = self.time_salltoall = self.time_moe = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def _op(self, what):
        if self._number is None:  # at the first call: the set's ranks run their layers in the same order
            key = self.ep_group.process_set_id
            self._number = MOELayer._made[key] = MOELayer._made.get(key, 0) + 1
        return f"moe.{self._number}.{self.ep_group_name}.{what}"

    def forward(self, *input, **kwargs):
        x = input[0]
        used_token = input[1] if len(input) > 1 else kwargs.get("used_token")
        d_model = x.shape[-1]
        tokens = x.reshape(-1, d_model)
        if self.ep_size > 1 and self.ep_group is None:
            raise RuntimeError(f"MoE layer {self.ep_group_name}: its expert-parallel process set is not made yet "
                               "(deepspeed.init_distributed() before building the model, or deepspeed.initialize)")
        tp_set, tp = _tp()
        if tp > 1 and self.training:
            # The gate's draws (random token selection, second-expert sampling, noisy gates)
            # must agree on a tensor-parallel group's ranks, which route the same tokens.
            seed = hvd.broadcast(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64), root_rank=tp_set.ranks[0],
                                 name=self._op("tp.seed"), process_set=tp_set)
            with torch.random.fork_rng(devices=[tokens.device] if tokens.is_cuda else []):
                torch.manual_seed(int(seed[0]))
                self.l_aux, routing, self.exp_counts = self.gate(tokens, used_token)
        else:
            self.l_aux, routing, self.exp_counts = self.gate(tokens, used_token)
        if routing.capacity is None and self.ep_size > 1 and tp == 1:
            combined = self._dispatch_uneven(tokens, routing)
        else:
            combined = self._dispatch_even(tokens, routing)
        return combined.to(x.dtype).reshape(x.shape)

    def _dispatch_even(self, tokens, routing):
        """Fixed [E, C, M] slots (C: the capacity, or the most any expert got without dropping).
        Under tensor parallelism each rank of a tensor-parallel group sends 1/tp of the slots
        (the group's ranks hold the same tokens) and the outputs are joined after the combine;
        tensor-parallel experts first join their group's slots, each computing its slice."""
        S, M = tokens.shape
        E = self.ep_size * self.num_local_experts
        tp_set, tp = _tp()
        C = routing.capacity
        if C is None:
            C = int(torch.bincount(routing.expert[routing.expert >= 0], minlength=E).max().item()) if \
                (routing.expert >= 0).any() else 0
            C = max(C, 1)
            if self.ep_size > 1:  # one block size over the set
                most = torch.tensor([C], dtype=torch.int64)
                C = int(hvd.allreduce(most, op=hvd.Max, name=self._op("capacity"), process_set=self.ep_group)[0])
            C = -(-C // tp) * tp
        elif C % tp:
            raise ValueError(f"MoE {self.ep_group_name}: capacity {C} does not split over the tensor-parallel size "
                             f"{tp}; choose capacity_factor or min_capacity so that it does")
        slot = torch.where(routing.expert >= 0, routing.expert * C + routing.location,
                           torch.full_like(routing.expert, -1))
        dispatched = _place(tokens, slot, E * C).view(E, C, M)
        if tp > 1:
            dispatched = _DropTokens.apply(dispatched, tp_set, self._op("tp.drop"))
        if self.ep_size > 1:
            dispatched = hvd.alltoall(dispatched.contiguous(), name=self._op("dispatch"), process_set=self.ep_group)
        if self.expert_tp:
            dispatched = _GatherTokens.apply(dispatched, tp_set, self._op("tp.gather"))
        out = self.experts(dispatched.reshape(self.ep_size, self.num_local_experts, -1, M))
        out = out.reshape(E, -1, M)
        if self.expert_tp:
            out = _DropTokens.apply(out, tp_set, self._op("tp.drop.out"))
        if self.ep_size > 1:
            out = hvd.alltoall(out.contiguous(), name=self._op("combine"), process_set=self.ep_group)
        if tp > 1:
            out = _GatherTokens.apply(out, tp_set, self._op("tp.gather.out"))
        return _combine(out.reshape(E * C, M), slot, routing.weight, S)

    def _dispatch_uneven(self, tokens, routing):
        """Every routed token and nothing else: per-expert counts over the set, then alltoallv."""
        S, M = tokens.shape
        L, P = self.num_local_experts, self.ep_size
        E = L * P
        expert = routing.expert
        valid = expert >= 0
        counts = torch.bincount(expert[valid], minlength=E)
        offsets = torch.cumsum(counts, 0) - counts
        # Each route's row in the send buffer: its expert's block, then its place in the queue.
        pos = torch.where(valid, offsets[expert.clamp(min=0)] + routing.location, torch.full_like(expert, -1))
        total = int(counts.sum().item())
        send = _place(tokens, pos, total)
        every = hvd.allgather(counts.to(torch.int64).unsqueeze(0).cpu(), name=self._op("counts"),
                              process_set=self.ep_group)  # [P, E]: what each rank sends each expert
        me = self.ep_group.rank()
        splits = counts.view(P, L).sum(dim=1).tolist()
        received, _ = hvd.alltoall(send, splits=splits, name=self._op("dispatch"), process_set=self.ep_group)
        mine = every[:, me * L:(me + 1) * L]  # [P, L]: rows from rank p for my expert j
        starts = torch.cumsum(mine.reshape(-1), 0) - mine.reshape(-1)
        starts = starts.view(P, L)
        order, outputs = [], []
        for j in range(L):
            rows = [torch.arange(int(starts[p, j]), int(starts[p, j] + mine[p, j])) for p in range(P)]
            idx = torch.cat(rows).to(tokens.device)
            out = self.experts.deepspeed_experts[j](received.index_select(0, idx))
            outputs.append(out[0] if isinstance(out, tuple) else out)
            order.append(idx)
        order = torch.cat(order)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        result = torch.cat(outputs).index_select(0, back)
        returned, _ = hvd.alltoall(result.contiguous(), splits=mine.sum(dim=1).tolist(), name=self._op("combine"),
                                   process_set=self.ep_group)
        return _combine(returned, pos, routing.weight, S)
