"""MoE beside tensor parallelism on 4 ranks (tp 2 x dp 2, chorus.parallel's mpu), against
one process holding the whole model and stepping on both data-parallel replicas' batches.
The dense part is column/row-parallel; the MoE layer's experts are either whole (the
default: the expert-parallel sets span the slices and each slice routes half of its
replica's slots) or themselves column/row-parallel (enable_expert_tensor_parallelism).
ZeRO 0/1/2, with and without dropping, clipping by the whole model's norm: every step's
loss and every weight equal the single process's. Then a checkpoint: zero_to_fp32 joins
the slices into the plain model's weights, and a fresh engine loads the same weights."""
import os
import shutil
import tempfile
import warnings

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.layer import MoE
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from chorus.deepspeed.utils import groups
from chorus.deepspeed.utils.zero_to_fp32 import consolidate
from chorus.parallel import ColumnParallelLinear, RowParallelLinear, mpu

warnings.simplefilter("ignore")
deepspeed.init_distributed(dist_init_required=False)
mpu.initialize_model_parallel(tensor_model_parallel_size=2)
W, R = hvd.size(), hvd.rank()
TP, TR = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
DP, DR = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
E, M, H, C, MB, STEPS = 4, 8, 12, 3, 8, 3


def expert_weights(g):
    """Global expert g's full weights (up, up bias, down, down bias)."""
    gen = torch.Generator().manual_seed(100 + g)
    return [torch.randn(s, generator=gen) * 0.5 for s in ((H, M), (H,), (M, H), (M,))]


class Net(torch.nn.Module):
    """plain: the single-process model (nn.Linear everywhere, every expert, ep 1)."""

    def __init__(self, ep, k, drop, sliced, ep_rank=0, plain=False, random_gate=False):
        super().__init__()
        torch.manual_seed(1)
        self.up = torch.nn.Linear(M, 2 * M) if plain else ColumnParallelLinear(M, 2 * M, gather_output=False)
        torch.manual_seed(2)
        self.down = torch.nn.Linear(2 * M, M) if plain else RowParallelLinear(2 * M, M, input_is_parallel=True)
        cut = sliced and not plain
        expert = torch.nn.Sequential(
            ColumnParallelLinear(M, H, gather_output=False) if cut else torch.nn.Linear(M, H), torch.nn.Tanh(),
            RowParallelLinear(H, M, input_is_parallel=True) if cut else torch.nn.Linear(H, M))
        self.moe = MoE(M, expert, num_experts=E, ep_size=1 if plain else ep, k=k, min_capacity=2, drop_tokens=drop,
                       use_rts=random_gate, enable_expert_tensor_parallelism=cut,
                       top2_2nd_expert_sampling=random_gate, noisy_gate_policy="Jitter" if random_gate else None)
        torch.manual_seed(4)
        self.head = torch.nn.Linear(M, C)
        local = self.moe.deepspeed_moe.experts.deepspeed_experts
        for j, e in enumerate(local):
            w1, b1, w2, b2 = expert_weights(j if plain else ep_rank * len(local) + j)
            if cut:  # this slice's rows of the first layer, columns of the second
                w1, b1, w2 = w1.chunk(TP, 0)[TR], b1.chunk(TP, 0)[TR], w2.chunk(TP, 1)[TR]
            with torch.no_grad():
                for p, v in zip((e[0].weight, e[0].bias, e[2].weight, e[2].bias), (w1, b1, w2, b2)):
                    p.copy_(v)

    def forward(self, x, y):
        h = torch.tanh(self.down(torch.tanh(self.up(x))))
        h, l_aux, _ = self.moe(h)
        return F.cross_entropy(self.head(h), y) + 0.01 * l_aux


def batch(step, replica):
    g = torch.Generator().manual_seed(10 * step + replica)
    return torch.randn(MB, M, generator=g), torch.randint(0, C, (MB,), generator=g)


def reference(k, drop, clip, lr):
    """The plain model on both replicas' batches (their mean loss), with torch's AdamW."""
    saved, groups.mpu = groups.mpu, None  # one process: no tensor-parallel dispatch
    try:
        net = Net(1, k, drop, False, plain=True)
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            per = []
            for r in range(DP):
                loss = net(*batch(step, r))
                (loss / DP).backward()
                per.append(float(loss))
            if clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            losses.append(per)
    finally:
        groups.mpu = saved
    return net, losses


def mine(name, full, sliced):
    """This rank's piece of a plain-model tensor, as the parallel model holds it."""
    if name in ("up.weight", "up.bias") or (sliced and name.endswith((".0.weight", ".0.bias"))):
        return full.chunk(TP, 0)[TR]
    if name == "down.weight" or (sliced and name.endswith(".2.weight")):
        return full.chunk(TP, 1)[TR]
    return full


def global_name(name, ep, ep_rank):
    """A parameter's name in the plain model (experts by their global number)."""
    mark = "deepspeed_experts."
    if mark not in name:
        return name
    head, rest = name.split(mark)
    j, inner = rest.split(".", 1)
    return f"{head}{mark}{ep_rank * (E // ep) + int(j)}.{inner}"


def close(a, b, what):
    assert torch.allclose(a, b, rtol=2e-4, atol=2e-5), f"rank {R}: {what}: {(a - b).abs().max()}"


# (stage, ep, k, drop, clip, sliced experts): whole experts at ep 1, 2, 4 (the expert-parallel
# sets span the slices); sliced ones at ep 1 and 2 (within each slice's data-parallel set).
cases = [(0, 2, 1, True, 0.0, False), (1, 4, 2, True, 0.3, False), (2, 2, 1, False, 0.3, False),
         (2, 1, 2, True, 0.0, False), (2, 2, 1, True, 0.3, True), (1, 1, 2, False, 0.0, True),
         (0, 2, 2, True, 0.3, True)]
for stage, ep, k, drop, clip, sliced in cases:
    what = f"stage={stage} ep={ep} k={k} drop={drop} clip={clip} sliced={sliced}"
    lr = 0.02
    groups._reset()  # each case makes its sets anew (whole and sliced experts of one ep_size differ)
    ep_rank = DR % ep if sliced else R % ep
    net = Net(ep, k, drop, sliced, ep_rank)
    cfg = {"train_micro_batch_size_per_gpu": MB, "gradient_clipping": clip,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 50}}
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=cfg, mpu=mpu)
    part = engine._expert_parts[0]
    assert part.ep_rank == ep_rank and part.ep_set.size() == ep and part.sliced == sliced, (what, part.ep_set.ranks)
    ref, ref_losses = reference(k, drop, clip, lr)
    for step in range(STEPS):
        loss = engine(*batch(step, DR))
        engine.backward(loss)
        engine.step()
        assert abs(float(loss) - ref_losses[step][DR]) < 2e-4, (what, step, float(loss), ref_losses[step][DR])
    whole = dict(ref.named_parameters())
    for n, p in net.named_parameters():
        close(p.data, mine(n, whole[global_name(n, ep, ep_rank)].data, sliced), f"{n} {what}")
    if stage >= 1 and drop:  # a checkpoint: each slice's files, joined by zero_to_fp32
        save_dir = hvd.broadcast_object(tempfile.mkdtemp(prefix="moe-tp-") if R == 0 else None, root_rank=0,
                                        name="moe.tp.dir")
        engine.save_checkpoint(save_dir, tag="t")
        joined = consolidate(save_dir, "t")
        assert sorted(joined) == sorted(whole), (sorted(joined), sorted(whole))
        for n, t in joined.items():
            close(t, whole[n].data, f"zero_to_fp32 {n} {what}")
        engine.save_16bit_model(save_dir, "plain.bin")  # every expert, every slice joined
        plain = torch.load(os.path.join(save_dir, "plain.bin"))
        assert sorted(plain) == sorted(ref.state_dict()), (sorted(plain), sorted(ref.state_dict()))
        for n, p in net.named_parameters():
            assert torch.equal(mine(n, plain[global_name(n, ep, ep_rank)], sliced), p.data), ("16bit", n, what)
        again = Net(ep, k, drop, sliced, ep_rank)
        params = split_params_into_different_moe_groups_for_optimizer({"params": list(again.parameters())})
        engine2, _, _, _ = deepspeed.initialize(model=again, model_parameters=params, config=cfg, mpu=mpu)
        engine2.load_checkpoint(save_dir, tag="t")
        for (n, p), q in zip(net.named_parameters(), again.parameters()):
            assert torch.equal(p.data, q.data), ("loaded", n, what)
        hvd.barrier()
        if R == 0:
            shutil.rmtree(save_dir)
        print(f"moe tp checkpoint ok rank {R} {what}", flush=True)
    print(f"moe tp ok rank {R} {what}", flush=True)
# Random gates (token selection, second-expert sampling, jitter) with every rank's RNG
# seeded apart: a tensor-parallel group's ranks still route alike, so the weights they
# hold alike stay equal and their losses agree.
for sliced in (False, True):
    groups._reset()
    net = Net(2, 2, True, sliced, DR % 2 if sliced else R % 2, random_gate=True)
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=cfg, mpu=mpu)
    torch.manual_seed(1000 + R)
    for step in range(STEPS):
        loss = engine(*batch(step, DR))
        engine.backward(loss)
        engine.step()
        both = hvd.allgather(loss.detach().reshape(1), name=f"rng.loss.{sliced}.{step}",
                             process_set=mpu.get_model_parallel_group())
        assert torch.equal(both[0], both[1]), (sliced, step, both)
    for n, p in net.named_parameters():
        if not getattr(p, "model_parallel", False) and (sliced or "deepspeed_experts" not in n):  # held alike
            both = hvd.allgather(p.data.unsqueeze(0), name=f"rng.{sliced}.{n}", process_set=mpu.get_model_parallel_group())
            assert torch.equal(both[0], both[1]), (sliced, n)
    print(f"moe tp random gate ok rank {R} sliced={sliced}", flush=True)

# A capacity of 3 slots cannot split over 2 slices: every rank refuses it, naming both.
groups._reset()
net = Net(2, 1, True, False, R % 2)
net.moe.deepspeed_moe.gate.capacity_factor = 1.5  # ceil(8 tokens / 4 experts * 1.5) = 3
params = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=cfg, mpu=mpu)
try:
    engine(*batch(0, DR))
    raise SystemExit("a capacity of 3 over 2 slices was accepted")
except ValueError as e:
    assert "capacity 3 does not split over the tensor-parallel size 2" in str(e), e
print(f"moe tensor parallel ok rank {R}", flush=True)
