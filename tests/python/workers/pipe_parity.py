"""chorus.deepspeed.pipe against the same model trained in one process: STAGES
pipeline stages (the rest of the ranks data-parallel), 1F1B over 4 micro-batches,
a tied weight on the first and last stages, fp32 or bf16 (DTYPE). After each step
the stage's parameters and the returned loss must equal the reference's; then a
checkpoint saved per stage loads back to the same training path. ACT_CKPT=k
checkpoints the activations of every k layers (the gradients must not change).

argv: STAGES DTYPE CHECKPOINT_DIR"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
import chorus.torch as hvd

STAGES, DTYPE, CKPT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
MICRO, MB, STEPS, LR, BASE = 4, 3, 3, 0.05, 1234

deepspeed.init_distributed()
world = hvd.size()
dp = world // STAGES


def tied_out(module, x):  # the output layer reuses the input layer's weight
    return F.linear(x, module.weight)


def specs():
    return [TiedLayerSpec("embed", torch.nn.Linear, 6, 6), torch.nn.Tanh(),
            LayerSpec(torch.nn.Linear, 6, 10), torch.nn.ReLU(),
            LayerSpec(torch.nn.Linear, 10, 10), torch.nn.Tanh(),
            LayerSpec(torch.nn.Linear, 10, 6), torch.nn.Tanh(),
            TiedLayerSpec("embed", torch.nn.Linear, 6, 6, forward_fn=tied_out)]


def loss_fn(out, label):
    return ((out.float() - label) ** 2).mean()


def batch(step, replica, micro):
    g = torch.Generator().manual_seed(1000 * step + 10 * replica + micro)
    x = torch.randn(MB, 6, generator=g)
    return x, torch.sin(x).sum(1, keepdim=True).expand(MB, 6) * 0.3


class Reference(torch.nn.Module):
    """The same layers in one process, built with the same seeds."""

    def __init__(self):
        super().__init__()
        layers = specs()
        self.mods = []
        self.embed = None
        for i, spec in enumerate(layers):
            torch.manual_seed(BASE + i)
            if isinstance(spec, TiedLayerSpec):
                if self.embed is None:
                    self.embed = spec.build()
                    self.mods.append(self.embed)
                else:
                    self.mods.append(lambda x: tied_out(self.embed, x))
            elif isinstance(spec, LayerSpec):
                m = spec.build()
                self.add_module(str(i), m)
                self.mods.append(m)
            else:
                self.mods.append(spec)

    def forward(self, x):
        for m in self.mods:
            x = m(x)
        return x


config = {"train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": MICRO,
          "optimizer": {"type": "SGD", "params": {"lr": LR}}, "zero_optimization": {"stage": 1 if dp > 1 else 0}}
if DTYPE == "bf16":
    config["bf16"] = {"enabled": True}
if DTYPE == "fp16":  # a small first scale: no step overflows, and every stage must agree on it
    config["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2}
net = PipelineModule(layers=specs(), num_stages=STAGES, loss_fn=loss_fn, partition_method="parameters",
                     seed_layers=True, base_seed=BASE,
                     activation_checkpoint_interval=int(os.environ.get("ACT_CKPT", "0")))
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
                                       config=config)
assert engine.num_stages == STAGES and engine.is_first_stage() == (engine.stage_id == 0)
replica = engine.grid.index("data")

ref = Reference()
ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
# Which reference parameters each local parameter is: by layer index.
local = {}
for index in range(net.parts[engine.stage_id], net.parts[engine.stage_id + 1]):
    spec = specs()[index]
    if isinstance(spec, TiedLayerSpec):
        local[f"tied_modules.embed"] = ref.embed
    elif isinstance(spec, LayerSpec):
        local[str(index)] = getattr(ref, str(index))
tol = dict(rtol=2e-2, atol=2e-2) if DTYPE in ("bf16", "fp16") else dict(rtol=1e-5, atol=1e-6)


def check(step):
    for name, p in net.named_parameters():
        prefix, attr = name.rsplit(".", 1)
        if prefix == "tied_modules.embed" and attr == "bias" and engine.stage_id != 0 and \
                0 not in net.tied_keys_everywhere()["embed"][:1]:
            continue
        if prefix == "tied_modules.embed" and attr == "bias" and engine.stage_id != 0:
            continue  # the output layer uses only the weight: its own bias never trains
        want = getattr(local[prefix], attr).detach()
        assert torch.allclose(p.detach().float(), want, **tol), (step, name, p, want)


def train(steps, start=0):
    losses = []
    for step in range(start, start + steps):
        it = iter([batch(step, replica, i) for i in range(MICRO)])
        losses.append(float(engine.train_batch(it)))
        ref_opt.zero_grad()
        total = 0.0
        for d in range(dp):
            for i in range(MICRO):
                x, y = batch(step, d, i)
                loss = loss_fn(ref(x), y)
                (loss / (MICRO * dp)).backward()
                total += float(loss)
        ref_opt.step()
        assert abs(losses[-1] - total / (MICRO * dp)) <= (2e-2 if DTYPE != "fp32" else 1e-5), (losses[-1], total)
        check(step)
        # Every stage stepped (or skipped) alike, under the same loss scale.
        seen = hvd.allgather_object((engine.loss_scale, engine.skipped_steps, engine.global_steps))
        assert len(set(seen)) == 1, seen
    return losses


train(STEPS)
# A checkpoint per stage, then one more step; loading it back and redoing that
# step must give the same parameters.
engine.save_checkpoint(CKPT, tag="ckpt")
saved_ref = {k: v.clone() for k, v in ref.state_dict().items()}
train(1, start=STEPS)
after = {n: p.detach().clone() for n, p in net.named_parameters()}
for n, p in net.named_parameters():
    p.data.add_(1.0)  # spoil the weights: loading must restore them
engine.load_checkpoint(CKPT)
ref.load_state_dict(saved_ref)
train(1, start=STEPS)
for n, p in net.named_parameters():
    assert torch.equal(p.detach(), after[n]), n
print(f"rank {hvd.rank()} stage {engine.stage_id}: pipe parity ok", flush=True)
