"""Tensor parallelism (2 ranks per group, the rest data-parallel) against the same
model in one process: a vocabulary-parallel embedding, column- and row-parallel
linears, and the vocabulary-parallel cross-entropy. Forward loss, every slice's
gradient, and Adam steps through deepspeed.initialize(mpu=...) with gradient
clipping (whose norm must count a bias the ranks hold alike once) must match.

argv: DTYPE (fp32 or bf16)"""
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.parallel import mpu
import chorus.torch as hvd
from tp_model import DIM, HIDDEN, VOCAB, Parallel

DTYPE = sys.argv[1]
TOKENS, LR, CLIP = 10, 0.01, 0.05

deepspeed.init_distributed()
mpu.initialize_model_parallel(tensor_model_parallel_size=2)
tp, tr = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
dp, dr = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
assert tp == 2 and tp * dp == hvd.size()
assert mpu.get_model_parallel_src_rank() == hvd.rank() - tr


class Reference(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        torch.manual_seed(2)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        torch.manual_seed(3)
        self.down = torch.nn.Linear(HIDDEN, DIM)
        torch.manual_seed(4)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids, target):
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        return F.cross_entropy(self.head(h).float(), target)


def data(step, replica):
    g = torch.Generator().manual_seed(100 * step + replica)
    return torch.randint(0, VOCAB, (TOKENS,), generator=g), torch.randint(0, VOCAB, (TOKENS,), generator=g)


def shard(name, full):
    """This rank's slice of a reference tensor, as the parallel layer holds it."""
    if name in ("embed.weight", "up.weight", "up.bias", "head.weight"):
        return full.chunk(tp, dim=0)[tr]
    if name == "down.weight":
        return full.chunk(tp, dim=1)[tr]
    return full  # down.bias: the same on every rank


par, ref = Parallel(), Reference()
for name, p in par.named_parameters():
    assert torch.equal(p.detach(), shard(name, dict(ref.named_parameters())[name].detach())), name

# Forward and backward in fp32, without the engine.
ids, target = data(0, dr)
loss = par(ids, target)
ref_loss = ref(ids, target)
assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6), (loss, ref_loss)
loss.backward()
ref_loss.backward()
for name, p in par.named_parameters():
    want = shard(name, dict(ref.named_parameters())[name].grad)
    assert torch.allclose(p.grad, want, rtol=1e-5, atol=1e-6), (name, p.grad, want)
par.zero_grad()
ref.zero_grad()

# Adam steps through the engine: ZeRO-1 over the data-parallel set, clipping by
# the whole model's norm.
config = {"train_micro_batch_size_per_gpu": TOKENS, "gradient_accumulation_steps": 1, "gradient_clipping": CLIP,
          "optimizer": {"type": "Adam", "params": {"lr": LR}}, "zero_optimization": {"stage": 1}}
if DTYPE == "bf16":
    config["bf16"] = {"enabled": True}
engine, _, _, _ = deepspeed.initialize(model=par, model_parameters=par.parameters(), config=config, mpu=mpu)
assert engine.process_set.ranks == sorted(mpu.get_data_parallel_group().ranks) if dp > 1 else True
ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
tol = dict(rtol=3e-2, atol=3e-2) if DTYPE == "bf16" else dict(rtol=1e-4, atol=1e-5)
for step in range(3):
    ids, target = data(step, dr)
    loss = engine(ids, target)
    engine.backward(loss)
    engine.step()
    ref_opt.zero_grad()
    for replica in range(dp):
        (ref(*data(step, replica)) / dp).backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
    ref_opt.step()
    if DTYPE == "fp32":
        got = engine.get_global_grad_norm()
        assert abs(got - float(norm)) <= 1e-4 * float(norm), (step, got, float(norm))
    for name, p in par.named_parameters():
        want = shard(name, dict(ref.named_parameters())[name].detach())
        assert torch.allclose(p.detach().float(), want, **tol), (step, name, p, want)

# A checkpoint: each tensor-parallel slice saves its own state (DeepSpeed's mp_rank_XX
# files) into the one folder; a fresh engine loads its slice and goes on as the saver does.
save_dir = hvd.broadcast_object(tempfile.mkdtemp(prefix="tp-ckpt-") if hvd.rank() == 0 else None, root_rank=0,
                                 name="tp.ckpt.dir")
engine.save_checkpoint(save_dir, tag="t")
files = sorted(os.listdir(os.path.join(save_dir, "t")))
assert sum("mp_rank_" in f for f in files) >= 2 * tp, files
# zero_to_fp32 joins the slices into the plain model's weights; --mp-rank gives one slice.
from chorus.deepspeed.utils.zero_to_fp32 import consolidate
whole, mine = consolidate(save_dir, "t"), consolidate(save_dir, "t", mp_rank=tr)
assert sorted(whole) == sorted(n for n, _ in ref.named_parameters()), sorted(whole)
for name, p in par.named_parameters():
    assert tuple(whole[name].shape) == tuple(dict(ref.named_parameters())[name].shape), name
    assert torch.equal(shard(name, whole[name]).to(p.dtype), p.detach()), name
    assert torch.equal(mine[name].to(p.dtype), p.detach()), name
# save_16bit_model writes the plain model's weights once, the slices joined.
engine.save_16bit_model(save_dir, "plain.bin")
plain = torch.load(os.path.join(save_dir, "plain.bin"))
assert sorted(plain) == sorted(n for n, _ in ref.named_parameters()), sorted(plain)
for name, p in par.named_parameters():
    assert torch.equal(shard(name, plain[name]), p.detach()), ("save_16bit_model", name)
again = Parallel()
engine2, _, _, _ = deepspeed.initialize(model=again, model_parameters=again.parameters(), config=config, mpu=mpu)
engine2.load_checkpoint(save_dir, tag="t")
for (name, p), q in zip(par.named_parameters(), again.parameters()):
    assert torch.equal(p.detach(), q.detach()), (step, name)
ids, target = data(3, dr)
for e in (engine, engine2):
    e.backward(e(ids, target))
    e.step()
for (name, p), q in zip(par.named_parameters(), again.parameters()):
    assert torch.equal(p.detach(), q.detach()), ("after a step", name)
hvd.barrier()
if hvd.rank() == 0:
    shutil.rmtree(save_dir)
print(f"rank {hvd.rank()}: tensor parallel ok", flush=True)
