"""chorus.deepspeed's ZeRO engine on the GPU against the same engine in host
memory (DS_ACCELERATOR=cpu) and against one plain torch process on the global
batch: stages 0-3 x fp16/bf16/fp32 x offload none/optimizer/param, a small MLP
and a small Transformer layer; then a checkpoint saved by the GPU engine,
loaded by a host engine; then the device memory of model states against the
ZeRO paper's formulas.

    chorusrun -np 1|2 python3 tests/gpu/workers/zero_device.py [--quick] [--ckpt DIR]
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

STEPS = 6
# Without a GPU (a dry run of this file's logic) both engines are host engines.
GPU = "cuda" if torch.cuda.is_available() else "cpu"
# fp16 on the CPU needs torch 2's half kernels (torch 1.13 has no half matmul there): the host
# engine's fp16 path, which the GPU comparison uses, runs in CI under the torch 2 venv.
DTYPES = ("fp32", "bf16", "fp16") if GPU == "cuda" or int(torch.__version__.split(".")[0]) >= 2 else ("fp32", "bf16")


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


class TinyTransformer(nn.Module):
    """One pre-norm attention block and MLP, each of its weights in a module whose
    forward runs (stage 3 gathers a module's own parameters around its forward;
    nn.MultiheadAttention reads out_proj's weight without calling it)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(16, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.embed(x)
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        h = h + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = h + self.down(F.gelu(self.up(self.norm2(h))))
        return self.head(h.mean(dim=1))


def batches(kind, world, rank, micro):
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(STEPS):
        shape = (micro * world, 32) if kind == "mlp" else (micro * world, 5, 16)
        x, y = torch.randn(*shape, generator=g), torch.randint(0, 10, (micro * world,), generator=g)
        out.append((x[rank * micro:(rank + 1) * micro], y[rank * micro:(rank + 1) * micro], x, y))
    return out


def config(stage, dtype, offload, micro):
    c = {"train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000, "stage3_param_persistence_threshold": 100}}
    if offload in ("optimizer", "param"):
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "param":
        c["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if dtype == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def run(kind, cfg, on_gpu, data):
    torch.manual_seed(5)
    model = mlp() if kind == "mlp" else TinyTransformer()
    os.environ["DS_ACCELERATOR"] = GPU if on_gpu else "cpu"
    engine, _, _, _ = deepspeed.initialize(model=model, config_params=cfg)
    want = GPU if on_gpu else "cpu"
    assert engine.device.type == want, (engine.device, want)
    losses = []
    for x, y, _, _ in data:
        x, y = x.to(engine.device), y.to(engine.device)
        loss = F.cross_entropy(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


def plain(kind, data):
    torch.manual_seed(5)
    model = (mlp() if kind == "mlp" else TinyTransformer()).to(GPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for _, _, x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(GPU)), y.to(GPU))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def close(a, b, tol):
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ckpt", default="")
    args = ap.parse_args()
    hvd.init()
    world, rank, micro = hvd.size(), hvd.rank(), 4
    tol = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}
    kinds = ["mlp"] if args.quick else ["mlp", "transformer"]
    failures = []
    for kind in kinds:
        data = batches(kind, world, rank, micro)
        reference = plain(kind, data)  # (every rank: the global batch in one process)
        for stage in (0, 1, 2, 3):
            for dtype in DTYPES:
                for offload in ("none", "optimizer", "param"):
                    if offload == "param" and stage != 3:
                        continue
                    cfg = config(stage, dtype, offload, micro)
                    gpu_engine, on_gpu = run(kind, cfg, True, data)
                    _, on_host = run(kind, cfg, False, data)
                    name = f"{kind} stage={stage} {dtype} offload={offload}"
                    if not close(on_gpu, on_host, tol[dtype]):
                        failures.append(f"{name}: GPU {on_gpu} host {on_host}")
                    # The ranks' mean loss is the global batch's.
                    mean = hvd.allreduce(torch.tensor(on_gpu, dtype=torch.float64), op=hvd.Average,
                                         name=f"mean.{name}").tolist()
                    # fp32 to the one process's losses; 16-bit ones (fp16 with its loss scaling) within their tolerance
                    if not close(mean, reference, 1e-3 if dtype == "fp32" else tol[dtype]):
                        failures.append(f"{name}: GPU {mean} one process {reference}")
                    if rank == 0:
                        print(f"{name}: losses {on_gpu[0]:.4f} -> {on_gpu[-1]:.4f} (host {on_host[-1]:.4f})", flush=True)
                    if args.ckpt and kind == "mlp" and stage == 2 and dtype == "bf16" and offload == "none":
                        gpu_engine.save_checkpoint(args.ckpt, tag="gpu")
                        if rank == 0:
                            torch.save({n: p.detach().cpu() for n, p in gpu_engine.module.named_parameters()},
                                       os.path.join(args.ckpt, "gpu_params.pt"))
                    if kind == "mlp" and dtype == "bf16" and offload == "none":
                        report = gpu_engine.memory_report()
                        if rank == 0:
                            print(f"memory stage={stage}: {report}", flush=True)
                        if not report["placement"].startswith(GPU):
                            failures.append(f"{name}: model states in {report['placement']}")
                        if abs(report["model_states"] - report["formula"]) > 0.05 * report["formula"]:
                            failures.append(f"{name}: model states {report['model_states']} B, the ZeRO formula "
                                            f"{report['formula']} B")
                    del gpu_engine
                    if GPU == "cuda":
                        torch.cuda.synchronize()
    if failures:
        raise SystemExit("\n".join(failures))
    print(f"zero device ok {rank}", flush=True)


if __name__ == "__main__":
    main()
