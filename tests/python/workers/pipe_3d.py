"""2 (data) x 2 (pipeline) x 2 (tensor) on 8 ranks against one process: a
vocabulary-parallel embedding and a tensor-parallel MLP on stage 0, another MLP
and a vocabulary-parallel head with its cross-entropy on stage 1, 1F1B over 3
micro-batches, Adam. Losses and every rank's slices must match the reference.

argv: DTYPE (fp32 or bf16)"""
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.deepspeed.pipe import LayerSpec, PipelineModule, PipeModelDataParallelTopology
from chorus.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, mpu, \
    vocab_parallel_cross_entropy
import chorus.torch as hvd

DTYPE = sys.argv[1]
VOCAB, DIM, HIDDEN, TOKENS, MICRO, LR, BASE = 16, 8, 12, 6, 3, 0.01, 50

deepspeed.init_distributed()
topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
mpu.initialize_model_parallel(topology=topo)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(DIM, HIDDEN, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, DIM, input_is_parallel=True)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(h)))


class RefMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(h)))


def loss_fn(logits, target):
    return vocab_parallel_cross_entropy(logits, target).mean()


layers = [LayerSpec(VocabParallelEmbedding, VOCAB, DIM), LayerSpec(MLP), LayerSpec(MLP),
          LayerSpec(ColumnParallelLinear, DIM, VOCAB, bias=False, gather_output=False)]
ref_layers = [lambda: torch.nn.Embedding(VOCAB, DIM), RefMLP, RefMLP, lambda: torch.nn.Linear(DIM, VOCAB, bias=False)]
net = PipelineModule(layers=layers, topology=topo, loss_fn=loss_fn, partition_method="uniform", seed_layers=True,
                     base_seed=BASE)
config = {"train_micro_batch_size_per_gpu": TOKENS, "gradient_accumulation_steps": MICRO,
          "optimizer": {"type": "Adam", "params": {"lr": LR}}, "zero_optimization": {"stage": 1}}
if DTYPE == "bf16":
    config["bf16"] = {"enabled": True}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
stage, replica, tr = engine.stage_id, engine.grid.index("data"), engine.grid.index("model")

ref = []
for i, make in enumerate(ref_layers):
    torch.manual_seed(BASE + i)
    ref.append(make())
ref_model = torch.nn.Sequential(*ref)
ref_opt = torch.optim.Adam(ref_model.parameters(), lr=LR)


def shard(layer, name, full):
    kind = type(ref[layer]).__name__
    if kind == "Embedding" or name in ("up.weight", "up.bias") or (kind == "Linear" and layer == 3):
        return full.chunk(2, dim=0)[tr]
    if name == "down.weight":
        return full.chunk(2, dim=1)[tr]
    return full


def batch(step, rep, micro):
    g = torch.Generator().manual_seed(1000 * step + 10 * rep + micro)
    return torch.randint(0, VOCAB, (TOKENS,), generator=g), torch.randint(0, VOCAB, (TOKENS,), generator=g)


tol = dict(rtol=3e-2, atol=3e-2) if DTYPE == "bf16" else dict(rtol=1e-4, atol=1e-5)
for step in range(3):
    loss = float(engine.train_batch(iter([batch(step, replica, i) for i in range(MICRO)])))
    ref_opt.zero_grad()
    total = 0.0
    for rep in range(2):
        for i in range(MICRO):
            ids, target = batch(step, rep, i)
            l = F.cross_entropy(ref_model(ids), target)
            (l / (2 * MICRO)).backward()
            total += float(l)
    ref_opt.step()
    assert abs(loss - total / (2 * MICRO)) <= (3e-2 if DTYPE == "bf16" else 1e-4), (step, loss, total / 6)
    for name, p in net.named_parameters():
        layer, rest = name.split(".", 1)
        want = shard(int(layer), rest, dict(ref[int(layer)].named_parameters())[rest].detach())
        assert torch.allclose(p.detach().float(), want, **tol), (step, name, p, want)
# A checkpoint: each stage's folder holds each tensor-parallel slice's files; a fresh
# engine loads them and holds the very same weights.
save_dir = hvd.broadcast_object(tempfile.mkdtemp(prefix="3d-ckpt-") if hvd.rank() == 0 else None, root_rank=0,
                                name="3d.ckpt.dir")
engine.save_checkpoint(save_dir, tag="t")
# save_16bit_model: every stage's layers, the slices joined, in one file.
engine.save_16bit_model(save_dir, "plain.bin")
plain = torch.load(os.path.join(save_dir, "plain.bin"))
assert sorted(plain) == sorted(ref_model.state_dict()), (sorted(plain), sorted(ref_model.state_dict()))
for name, p in net.named_parameters():
    layer, rest = name.split(".", 1)
    assert torch.equal(shard(int(layer), rest, plain[name]), p.detach()), ("save_16bit_model", name)
again = PipelineModule(layers=layers, topology=topo, loss_fn=loss_fn, partition_method="uniform", seed_layers=True,
                       base_seed=BASE + 7)
engine2, _, _, _ = deepspeed.initialize(model=again, model_parameters=again.parameters(), config=config)
assert any(not torch.equal(p.detach(), q.detach()) for p, q in zip(net.parameters(), again.parameters()))
engine2.load_checkpoint(save_dir, tag="t")
for (name, p), q in zip(net.named_parameters(), again.parameters()):
    assert torch.equal(p.detach(), q.detach()), ("loaded", name)
hvd.barrier()
if hvd.rank() == 0:
    shutil.rmtree(save_dir)
print(f"rank {hvd.rank()} (stage {stage}, replica {replica}, slice {tr}): 3d ok", flush=True)
