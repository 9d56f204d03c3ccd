"""The path a device engine takes for Lion, Adagrad and LAMB (torch ops over the
engine's fp32 partition: the optimizer's own class over partition views, LAMB's
trust ratio summed over the set), taken here on the CPU by telling the engine to:
each optimizer at ZeRO 1, 2 and 3 must give the same weights as chorus's CPU kernels."""
import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.runtime.engine import DeepSpeedEngine

PARAMS = {"Lion": {"lr": 3e-3, "weight_decay": 0.01}, "Adagrad": {"lr": 0.05, "weight_decay": 0.001},
          "Lamb": {"lr": 5e-3, "weight_decay": 0.01}}


def train(name, stage, torch_ops):
    DeepSpeedEngine._torch_ops_for = (lambda self, kind, offload: kind in ("lion", "adagrad", "lamb")) \
        if torch_ops else original
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": name, "params": PARAMS[name]},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 200}}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    assert (engine._client is not None) == torch_ops, (name, torch_ops)
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    for _ in range(5):
        x, y = torch.randn(4, 12, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
        engine.step()
    return [p.detach().clone() for p in engine.module_state_dict().values()]


hvd.init()
original = DeepSpeedEngine._torch_ops_for
for name in PARAMS:
    for stage in (1, 2, 3):
        kernels, torch_ops = train(name, stage, False), train(name, stage, True)
        worst = max((a - b).abs().max().item() for a, b in zip(kernels, torch_ops))
        assert worst < 2e-6, (name, stage, worst)
print(f"torch-ops optimizers ok {hvd.rank()}", flush=True)
