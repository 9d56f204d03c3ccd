"""checkpoint.format "deepspeed" under chorusrun, on what DeepSpeed's layout has to carry: a
tied embedding (saved under both names, trained once), a frozen parameter and a buffer, at
ZeRO 0-3, fp32 and bf16: a fresh engine that loads the save trains on exactly as the saving
engine does, its frozen parameter and buffer restored. A write that fails on one rank is an
error on every rank and `latest` still names the last good save; a format that is neither
is refused by name.

    zero_ds_layout.py FOLDER [DTYPES]   (default fp32,bf16; fp16 needs torch 2 on the CPU: its
                                         dynamic loss scale, started high to overflow, resumes too)
"""
import os
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.mid = torch.nn.Linear(6, 6)
        self.norm = torch.nn.BatchNorm1d(6)  # running stats: buffers
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.scale = torch.nn.Parameter(torch.full((6,), 0.5), requires_grad=False)  # frozen

    def forward(self, ids):
        h = self.norm(torch.tanh(self.mid(self.embed(ids))) * self.scale)
        return self.head(h)


def make(stage, dtype, fmt="deepspeed"):
    torch.manual_seed(0)
    model = Tied()
    with torch.no_grad():
        model.scale.uniform_(0.5, 1.5)  # (a frozen value the fresh engine's init does not have)
    torch.manual_seed(1)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}, "checkpoint": {"format": fmt}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 17, "loss_scale_window": 2, "hysteresis": 2}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    return engine


def train(engine, first, n):
    out = []
    for step in range(first, first + n):
        g = torch.Generator().manual_seed(step * 10 + hvd.rank())
        ids = torch.randint(0, 11, (4,), generator=g)
        loss = torch.nn.functional.cross_entropy(engine(ids).float(), ids)
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


folder = sys.argv[1]
hvd.init()
for stage in (0, 1, 2, 3):
    for dtype in (sys.argv[2] if len(sys.argv) > 2 else "fp32,bf16").split(","):
        where = os.path.join(folder, f"z{stage}_{dtype}")
        saver = make(stage, dtype)
        train(saver, 0, 4)
        scale, skipped = saver.core.loss_scale, saver.skipped_steps
        saver.save_checkpoint(where, client_state={"k": stage})
        # the buffers as rank 0 saves them (each rank's BatchNorm statistics are its own)
        saved_var = hvd.broadcast(saver.module.norm.running_var.detach().clone(), 0, name=f"var.{stage}.{dtype}")
        went_on = train(saver, 4, 4)
        fresh = make(stage, dtype)
        with torch.no_grad():
            fresh.module.scale.zero_()  # (the load must bring it back)
        _, client = fresh.load_checkpoint(where)
        assert client["k"] == stage, client
        assert fresh.core.loss_scale == scale and fresh.skipped_steps == skipped, (fresh.core.loss_scale, scale)
        assert torch.equal(fresh.module.scale, saver.module.scale), "the frozen parameter was not restored"
        assert torch.equal(fresh.module.norm.running_var, saved_var), (stage, dtype)
        resumed = train(fresh, 4, 4)
        assert resumed == went_on, (stage, dtype, resumed, went_on)

        print(f"ds layout z{stage} {dtype} ok (loss scale {scale}, {skipped} skipped)", flush=True)

# A failed write on rank 1 (its file's name taken by a folder): an error on both ranks, `latest` kept.
engine = make(2, "fp32")
train(engine, 0, 1)
good = os.path.join(folder, "fail")
engine.save_checkpoint(good, tag="good")
if hvd.rank() == 1:
    os.makedirs(os.path.join(good, "bad", "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
hvd.barrier()
try:
    engine.save_checkpoint(good, tag="bad")
    raise AssertionError("a failed write went unnoticed")
except RuntimeError as e:
    assert "rank(s) [1]" in str(e), e
with open(os.path.join(good, "latest")) as f:
    assert f.read() == "good"
try:
    make(1, "fp32", fmt="torch").save_checkpoint(os.path.join(folder, "bogus"))
    raise AssertionError("an unknown checkpoint.format was taken")
except ValueError as e:
    assert "'checkpoint.format' 'torch'" in str(e), e
print(f"ds layout refusals ok {hvd.rank()}", flush=True)
