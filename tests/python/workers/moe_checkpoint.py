"""MoE checkpoints on 4 ranks: saved at ep 2 under ZeRO-2, loaded at ep 1, 2 and 4
(and ZeRO-1) into a model started from other weights, the next steps' losses are
those the saving run went on to have (weights and optimizer states came back);
each expert's weights in DeepSpeed's layer_<L>_expert_<G>_mp_rank_00 file."""
import os
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from moe_common import E, Net, batch

warnings.simplefilter("ignore")
deepspeed.init_distributed(dist_init_required=False)
W, R = hvd.size(), hvd.rank()
folder = os.path.join(os.environ["ZERO_TMP"], "moe_ckpt")


def engine_for(ep, stage, seed):
    net = Net(ep, 2, True, R % ep, seed=seed)
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 40}}
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
    return net, engine


def train(engine, steps):
    losses = []
    for step in steps:
        loss = engine(*batch(step, R))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    return losses


net, engine = engine_for(2, 2, seed=100)
train(engine, range(3))
engine.save_checkpoint(folder, tag="moe")
# Each expert in its own file, written by the first rank holding it.
L = E // 2
for j, e in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts):
    g = (R % 2) * L + j
    state = torch.load(os.path.join(folder, "moe", f"layer_0_expert_{g}_mp_rank_00_model_states.pt"))
    for n, p in e.named_parameters():
        key = f"moe.deepspeed_moe.experts.deepspeed_experts.{g}.{n}"
        assert torch.equal(state[key], p.detach()), (key, sorted(state))
after = train(engine, range(3, 6))

for ep, stage in ((1, 2), (4, 2), (2, 1), (4, 0)):
    _, other = engine_for(ep, stage, seed=900)  # other weights: what it trains with next must come from the files
    other.load_checkpoint(folder, tag="moe")
    assert other.global_steps == 3
    got = train(other, range(3, 6))
    assert all(abs(a - b) < 2e-5 for a, b in zip(got, after)), (ep, stage, got, after)
    print(f"moe checkpoint ok rank {R} ep=2 -> ep={ep} stage {stage}", flush=True)

# One expert shard gone: every rank refuses the load (none is left waiting in it), naming the ranks.
hvd.barrier()
if R == 0:
    os.remove(os.path.join(folder, "moe", "expp_rank_1_ep_size_2_zero_rank_00001_optim_states.chorus"))
hvd.barrier()
_, other = engine_for(2, 2, seed=900)
try:
    other.load_checkpoint(folder, tag="moe")
    raise SystemExit("a checkpoint without one of its expert shards loaded")
except ValueError as e:
    assert "expert shards are missing on rank(s) [1, 3]" in str(e), e  # the holders of experts 2, 3
print(f"moe checkpoint refused ok rank {R}", flush=True)

# Frozen expert parameters and expert buffers travel in each expert's own file: saved at
# ep 2, loaded at ep 4, every rank gets its own experts' values (not rank 0's).
def with_frozen(ep, seed):
    net = Net(ep, 2, True, R % ep, seed=seed)
    for j, e in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts):
        e[0].bias.requires_grad_(False)
        e.register_buffer("tag", torch.full((2,), float(seed + (R % ep) * (E // ep) + j)))
    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
           "zero_optimization": {"stage": 2}}
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in net.parameters() if p.requires_grad]})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
    return net, engine


net, engine = with_frozen(2, 100)
train(engine, range(2))
engine.save_checkpoint(folder, tag="frozen")
net4, engine4 = with_frozen(4, 900)
engine4.load_checkpoint(folder, tag="frozen")
whole = Net(1, 2, True, 0, seed=100).moe.deepspeed_moe.experts.deepspeed_experts  # the frozen biases as made
e = net4.moe.deepspeed_moe.experts.deepspeed_experts[0]
assert torch.equal(e.tag, torch.full((2,), 100.0 + R)), e.tag  # ep 4: rank R holds expert R
assert torch.equal(e[0].bias, whole[R][0].bias.detach()), R
print(f"moe frozen experts ok rank {R}", flush=True)

# zero_to_fp32 puts every expert in, under its global number: the plain ep-1 model
# loads the consolidated state strictly and computes what the saving run computes.
from chorus.deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: E402
state = get_fp32_state_dict_from_zero_checkpoint(folder, tag="frozen")
plain = Net(1, 2, True, 0, seed=5)
for j, e in enumerate(plain.moe.deepspeed_moe.experts.deepspeed_experts):
    e.register_buffer("tag", torch.zeros(2))
plain.load_state_dict(state, strict=True)
x, y = batch(7, R)
assert abs(float(plain(x, y)) - float(net(x, y))) < 1e-5, (float(plain(x, y)), float(net(x, y)))
print(f"moe zero_to_fp32 ok rank {R}", flush=True)
