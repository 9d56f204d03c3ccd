"""What Transformers, Accelerate and Lightning use of DeepSpeed, checked on 2-3 ranks
against values computed here: deepspeed.comm, zero.Init and GatheredParameters
(before and after initialize), the config as clients write it, checkpoints of
models with 0-dim and non-persistent buffers, a save that fails on one rank."""
import json
import os
import sys
import tempfile

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed import comm as dist
from chorus.deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES, WarmupCosineLR, WarmupDecayLR

deepspeed.init_distributed()
rank, size = dist.get_rank(), dist.get_world_size()
assert (rank, size) == (hvd.rank(), hvd.size()) and torch.distributed.is_initialized()

# --- deepspeed.comm on torch.distributed ---
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == size * (size + 1) / 2
parts = [torch.zeros(2) for _ in range(size)]
dist.all_gather(parts, torch.full((2,), float(rank)))
assert [p[0].item() for p in parts] == list(range(size))
b = torch.tensor([float(rank)])
dist.broadcast(b, src=size - 1)
assert b.item() == size - 1
dist.barrier()

# --- the config as clients write it ---
base = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        "steps_per_print": float("inf")}
try:
    deepspeed.initialize(model=torch.nn.Linear(2, 2), config=dict(base, gradient_clipping="auto"))
    raise SystemExit("an unresolved 'auto' was accepted")
except ValueError as e:
    assert "'gradient_clipping' is \"auto\"" in str(e), e
assert "WarmupCosineLR" in VALID_LR_SCHEDULES and "OneCycle" in VALID_LR_SCHEDULES


# --- zero.Init: built partitioned; GatheredParameters gives whole values, modifier_rank writes ---
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 7)
        self.b = torch.nn.Linear(7, 3)
        self.register_buffer("count", torch.tensor(0.0))  # 0-dim
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * (1 + 0 * self.count)


torch.manual_seed(0)
plain = Net()
with deepspeed.zero.Init(config_dict_or_path=base):
    torch.manual_seed(0)
    net = Net()
for p in net.parameters():
    assert p.numel() == 0 and p.ds_numel == int(torch.tensor(p.ds_shape).prod()), p.ds_shape
    assert p.ds_tensor.numel() == -(-p.ds_numel // size)
with deepspeed.zero.GatheredParameters(list(net.parameters())):
    for (n, p), q in zip(net.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), n  # the same values as built without zero.Init
with deepspeed.zero.GatheredParameters(net.a.weight, modifier_rank=0):
    if rank == 0:
        net.a.weight.data.fill_(0.5)
assert net.a.weight.numel() == 0
with deepspeed.zero.GatheredParameters(net.a.weight):
    assert torch.all(net.a.weight == 0.5)  # rank 0's change reached every rank
    net.a.weight.data.fill_(9.0)  # without modifier_rank a change is dropped
with deepspeed.zero.GatheredParameters(net.a.weight):
    assert torch.all(net.a.weight == 0.5)
plain.a.weight.data.fill_(0.5)

# --- the engine takes zero.Init parameters; a model built plainly trains the same ---
engine, opt, _, _ = deepspeed.initialize(model=net, config=base)
torch.manual_seed(1)
x = torch.randn(2 * size, 5)
y = torch.randn(2 * size, 3)
popt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
for step in range(3):
    mine = slice(2 * rank, 2 * rank + 2)
    loss = torch.nn.functional.mse_loss(engine(x[mine]), y[mine])
    engine.backward(loss)
    engine.step()
    ref = torch.nn.functional.mse_loss(plain(x), y)  # mean over every rank's rows = the global batch
    ref.backward()
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)  # DeepSpeed 0.19.8's default gradient_clipping
    popt.step()
    popt.zero_grad()
with deepspeed.zero.GatheredParameters(list(net.parameters())):
    for (n, p), q in zip(net.named_parameters(), plain.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (n, (p - q).abs().max())
# After initialize, modifier_rank writes through the engine (16-bit copy and fp32 master).
with deepspeed.zero.GatheredParameters(net.b.bias, modifier_rank=size - 1):
    if rank == size - 1:
        net.b.bias.data.copy_(torch.tensor([1.0, 2.0, 3.0]))
with deepspeed.zero.GatheredParameters(net.b.bias):
    assert net.b.bias.tolist() == [1.0, 2.0, 3.0], net.b.bias
state = engine._zero3_consolidated_16bit_state_dict()
if rank == 0:
    assert state["b.bias"].tolist() == [1.0, 2.0, 3.0] and "scratch" not in state and state["count"].dim() == 0
else:
    assert state is None
assert engine.zero_gather_16bit_weights_on_model_save()
assert engine.config["zero_optimization"]["stage"] == 3 and engine.config["train_batch_size"] == 2 * size

# --- checkpoints: 0-dim and non-persistent buffers, frozen parameters, a failed save ---
root = sys.argv[1]
net.count.fill_(7.0)
engine.save_checkpoint(root, tag="t1")
if rank == 0:
    assert os.path.exists(os.path.join(root, "zero_to_fp32.py"))
net.count.fill_(0.0)
engine.load_checkpoint(root, tag="t1")
assert net.count.item() == 7.0
if rank == size - 1:  # this rank's disk fails (as a full or lost volume would)
    real_save = engine.core.save_shard

    def failing_save(path, meta):
        raise OSError(28, "No space left on device", path)

    engine.core = type("Core", (), {"__getattr__": lambda self, n: getattr(real_core, n),
                                    "save_shard": staticmethod(failing_save)})()
    real_core = engine._engine_core = real_save.__self__
try:
    engine.save_checkpoint(root, tag="failing")
    raise SystemExit("a save that failed on one rank returned normally")
except RuntimeError as e:
    assert f"failed on rank(s) [{size - 1}]" in str(e), e
    if rank == size - 1:
        assert "No space left on device" in str(e), e
if rank == size - 1:
    engine.core = real_core
engine.save_checkpoint(root, tag="t2")  # the runtime is still usable

# --- a checkpoint whose last shard comes from an older save of the same tag is refused ---
from chorus.deepspeed.runtime.zero.checkpoint import shard_name  # noqa: E402
engine.save_checkpoint(root, tag="mix")
last = os.path.join(root, "mix", shard_name(size - 1))
if rank == 0:
    os.link(last, last + ".older")
hvd.barrier()
loss = torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2])
engine.backward(loss)
engine.step()
engine.save_checkpoint(root, tag="mix")
if rank == 0:
    os.replace(last + ".older", last)
hvd.barrier()
try:
    engine.load_checkpoint(root, tag="mix")
    raise SystemExit("a checkpoint mixing two saves was loaded")
except Exception as e:  # noqa: BLE001
    assert "belongs to another save" in str(e) and shard_name(size - 1) in str(e), e
engine.load_checkpoint(root, tag="t2")  # and a whole one still loads


# --- register_external_parameter: a module whose forward uses another's weight ---
class Head(torch.nn.Module):
    def __init__(self, owner):
        super().__init__()
        self._owner = [owner]  # not a submodule: its weight is external to this module

    def forward(self, h):
        return torch.nn.functional.linear(h, self._owner[0].weight.t())


class TiedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(5, 6, bias=False)
        self.mid = torch.nn.Linear(6, 6)
        self.head = Head(self.inp)
        deepspeed.zero.register_external_parameter(self.head, self.inp.weight)

    def forward(self, x):
        return self.head(torch.relu(self.mid(self.inp(x))))


torch.manual_seed(2)
plain_tied = TiedNet()
with deepspeed.zero.Init(config_dict_or_path=base):
    torch.manual_seed(2)
    tied = TiedNet()
no_persist = dict(base, zero_optimization=dict(base["zero_optimization"], stage3_param_persistence_threshold=0))
tied_engine, _, _, _ = deepspeed.initialize(model=tied, config=no_persist)  # every parameter released after use
popt = torch.optim.AdamW(plain_tied.parameters(), lr=1e-2)
xt = torch.randn(2 * size, 5)
for step in range(2):
    out = tied_engine(xt[2 * rank:2 * rank + 2])
    tied_engine.backward(out.pow(2).mean())
    tied_engine.step()
    plain_tied(xt).pow(2).mean().backward()
    popt.step()
    popt.zero_grad()
with deepspeed.zero.GatheredParameters(list(tied.parameters())):
    for (n, p), q in zip(tied.named_parameters(), plain_tied.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (n, (p - q).abs().max())
print(f"ds clients ok rank {rank}", flush=True)
