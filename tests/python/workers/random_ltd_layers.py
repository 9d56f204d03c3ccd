"""Random-LTD's layers under chorus (DeepSpeed's own run on CUDA only): a wrapped layer
runs on the kept tokens only and passes the others by, forward and backward, against
the same computation written with plain indexing; an engine converted with
convert_to_random_ltd trains while its schedule grows to the whole sequence, keeps the
schedule in its checkpoint, and gives the plain model's parameter names."""
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.runtime.data_pipeline.data_routing import (RandomLayerTokenDrop, RandomLTDScheduler,
                                                                  convert_to_random_ltd)

T, D = 8, 6


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, D)

    def forward(self, hidden_states, attention_mask=None):
        return torch.tanh(self.lin(hidden_states)) + hidden_states


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, D)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(D, 2)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h).mean(dim=1)


def section(min_value, max_value):
    return {"enabled": True, "total_layer_num": 3, "random_ltd_layer_num": 3, "random_ltd_layer_id": [0, 1, 2],
            "model_mask_name": None, "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
            "random_ltd_schedule": {"min_value": min_value, "max_value": max_value, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": 4, "seq_per_step": 2}},
            "layer_token_lr_schedule": {"enabled": False}}


def check_one_layer():
    torch.manual_seed(0)
    block = Block()
    wrapped = RandomLayerTokenDrop(block)
    schedule = RandomLTDScheduler(dict(section(3, T), global_batch_size=2, micro_batch_size=2))
    wrapped.init_config(dict(section(3, T), micro_batch_size=2), schedule, 0)
    x = torch.randn(2, T, D, requires_grad=True)
    out = wrapped(x)
    kept = schedule.state["sample_idx"][0].long()  # [batch, 3], sorted
    assert kept.shape == (2, 3) and all(bool((k[1:] > k[:-1]).all()) for k in kept)
    x2 = x.detach().clone().requires_grad_(True)
    want = x2.clone()
    for b in range(2):
        want[b, kept[b]] = block(x2[b, kept[b]])
    assert torch.allclose(out, want, atol=1e-6)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    (want * upstream).sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-6)
    wrapped.eval()  # no dropping outside training
    assert torch.allclose(wrapped(x), block(x), atol=1e-6)


def make(folder_cfg):
    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "data_efficiency": {"enabled": True, "data_routing": {"random_ltd": section(4, T)}}}
    engine, _, _, _ = deepspeed.initialize(model=Net(), config=cfg)
    return convert_to_random_ltd(engine, Block)


hvd.init()
check_one_layer()
engine = make(None)
gen = torch.Generator().manual_seed(1 + hvd.rank())
seen = []
for _ in range(6):
    loss = engine(torch.randn(2, T, 4, generator=gen)).square().mean()
    engine.backward(loss)
    engine.step()
    seen.append(engine.random_ltd_scheduler.get_current_seq())
    assert torch.isfinite(loss)
assert seen == [4, 4, 6, 6, 8, 8], seen  # one update per optimizer step: 4 + 4 * step / 4, in twos
engine.save_checkpoint(sys.argv[1])
other = make(None)
other.load_checkpoint(sys.argv[1])
assert other.random_ltd_scheduler.state_dict() == engine.random_ltd_scheduler.state_dict()
names = set(engine.module_state_dict())
assert "blocks.0.lin.weight" in names and not any("random_ltd_layer" in n for n in names), names
print(f"random-LTD layers ok {hvd.rank()}", flush=True)
