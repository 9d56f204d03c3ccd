"""ZeRO-3 leaf modules: nn.MultiheadAttention reads out_proj.weight without calling
out_proj, so at stage 3 it must be a leaf (set_z3_leaf_modules, as with DeepSpeed);
then a TransformerEncoderLayer trains as one plain process on the global batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.utils import set_z3_leaf_modules, z3_leaf_module

STEPS = 4


def model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
                         nn.Flatten(), nn.Linear(16 * 3, 4))


def data(world):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(2 * world, 3, 8, generator=g), torch.randint(0, 4, (2 * world,), generator=g))
            for _ in range(STEPS)]


hvd.init()
world, rank = hvd.size(), hvd.rank()
plain = model()
opt = torch.optim.SGD(plain.parameters(), lr=0.1)
for x, y in data(world):
    opt.zero_grad()
    F.cross_entropy(plain(x), y).backward()
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)  # DeepSpeed 0.19.8's default gradient_clipping
    opt.step()

m = model()
assert set_z3_leaf_modules(m, [nn.MultiheadAttention]) and z3_leaf_module(m[1].self_attn)
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, _, _, _ = deepspeed.initialize(model=m, config_params=config)
for x, y in data(world):
    xs, ys = x[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2]
    engine.backward(F.cross_entropy(engine(xs), ys))
    engine.step()
got = engine.module_state_dict()
for name, p in plain.state_dict().items():
    assert torch.allclose(got[name].float(), p.float(), atol=1e-5), name
print(f"zero leaf ok {rank}", flush=True)
