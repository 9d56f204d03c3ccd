"""deepspeed.moe.layer.MoE at ep_size 1, 2 and 4 on 4 ranks: outputs, l_aux,
exp_counts and every gradient equal to one process holding every expert, run on
the same tokens (top-1 and top-2, with and without dropping, residual)."""
import itertools

import torch

import chorus.torch as hvd
from chorus.deepspeed.moe.layer import MoE
from chorus.deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

hvd.init(process_sets="dynamic")
W, R = hvd.size(), hvd.rank()
E, M, HID = 4, 8, 12


def build(ep, k, drop, residual):
    torch.manual_seed(0)
    expert = torch.nn.Sequential(torch.nn.Linear(M, HID), torch.nn.ReLU(), torch.nn.Linear(HID, M))
    moe = MoE(M, expert, num_experts=E, ep_size=ep, k=k, capacity_factor=1.0, min_capacity=2, use_residual=residual,
              drop_tokens=drop, use_rts=False, top2_2nd_expert_sampling=False)
    ep_rank = R % ep  # E + D layout: runs of ep consecutive ranks
    for j, e in enumerate(moe.deepspeed_moe.experts.deepspeed_experts):  # each global expert its own weights
        g = torch.Generator().manual_seed(100 + ep_rank * (E // ep) + j)
        with torch.no_grad():
            for p in e.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return moe


def tokens(s):
    g = torch.Generator().manual_seed(1000 + s)
    return torch.randn(2, 8, M, generator=g), torch.randn(2, 8, M, generator=torch.Generator().manual_seed(2000 + s))


def loss_of(out, l_aux, w):
    return (out * w).sum() + 0.1 * l_aux


def close(a, b, what):
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"rank {R}: {what} differs: {(a - b).abs().max()}"


checked, dropped, moved = 0, 0, 0.0
for ep, k, drop, residual in itertools.product([1, 2, 4], [1, 2, 3], [True, False], [False, True]):
    if residual and k > 1:
        continue
    moe = build(ep, k, drop, residual)
    ref = build(1, k, drop, residual)
    x, w = tokens(R)
    out, l_aux, counts = moe(x)
    loss_of(out, l_aux, w).backward()
    # The reference: this rank's tokens for the output and the non-expert gradients...
    rout, rl_aux, rcounts = ref(x)
    close(out, rout, f"output ep={ep} k={k} drop={drop}")
    close(l_aux, rl_aux, "l_aux")
    assert torch.equal(counts, rcounts), (counts, rcounts)
    if drop and k == 1:
        dropped += int((counts - 2 * 8 // E).clamp(min=0).sum())  # over the capacity of 16 tokens / 4 experts
    shared = {n: torch.autograd.grad(loss_of(rout, rl_aux, w), p, retain_graph=True)[0]
              for n, p in ref.named_parameters() if not is_moe_param(p)}
    for n, p in moe.named_parameters():
        if not is_moe_param(p):
            close(p.grad, shared[n], f"gradient of {n}")
    # ...and every rank of this expert-parallel set's tokens for the experts' gradients.
    ref.zero_grad()
    base = R - R % ep
    for s in range(base, base + ep):
        xs, ws = tokens(s)
        o, la, _ = ref(xs)
        loss_of(o, la, ws).backward()
    L = E // ep
    mine = moe.deepspeed_moe.experts.deepspeed_experts
    whole = ref.deepspeed_moe.experts.deepspeed_experts
    for j in range(L):
        for (n, p), (_, q) in zip(mine[j].named_parameters(), whole[(R % ep) * L + j].named_parameters()):
            assert is_moe_param(p) and p.group_name == f"ep_size_{ep}"
            moved += float(q.grad.abs().sum())
            close(p.grad, q.grad, f"expert {(R % ep) * L + j} gradient of {n} (ep={ep} k={k} drop={drop})")
    checked += 1

dropped = int(hvd.allreduce(torch.tensor([dropped]), op=hvd.Sum, name="dropped"))
assert dropped > 0 and moved > 0, (dropped, moved)  # the capacity dropped tokens; the experts learned
groups = split_params_into_different_moe_groups_for_optimizer({"params": list(moe.parameters()), "lr": 0.1})
assert [g.get("moe", False) for g in groups] == [False, True] and groups[1]["name"] == "ep_size_4", groups
assert all(g["lr"] == 0.1 for g in groups)

# Bad input: a clear error naming the values.
for kwargs, words in (({"num_experts": 3, "ep_size": 2}, "num_experts (3) must be divisible by ep_size (2)"),
                      ({"num_experts": 3, "ep_size": 3}, f"ep_size (3) must divide the world size ({W})")):
    try:
        MoE(M, torch.nn.Linear(M, M), **kwargs)
        raise SystemExit(f"no error for {kwargs}")
    except ValueError as e:
        assert words in str(e), e
print(f"moe layer ok rank {R} ({checked} layouts)", flush=True)
