"""The config's optimizers under every ZeRO stage, fp32 and bf16, with and without
offload_optimizer: each case trains the same small model on the same batches for
STEPS steps and records rank 0's losses, or the error initialize/step raised. Runs
under whatever `import deepspeed` is: the real DeepSpeed (the reference, under
torchrun) or chorus.deepspeed (under chorusrun); the test compares the two.

    optimizer_matrix.py OUT.json OPTIMIZER [OPTIMIZER ...]
    optimizer_matrix.py OUT.json --lamb-reference   (one process, no DeepSpeed)

The LAMB reference (DeepSpeed's FusedLamb runs on GPUs only) is computed here in
float64 torch: both ranks' batches, their averaged gradient clipped at 1.0, and
FusedLamb's update per tensor (bias correction on the step size, trust ratio
||w|| / ||update|| clamped to [0.01, 10]).
"""
import json
import sys

import torch


STEPS = 20
PARAMS = {
    "Lion": {"lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 0.01},
    "Adagrad": {"lr": 0.05, "weight_decay": 0.001},
    "Lamb": {"lr": 5e-3, "weight_decay": 0.01},
    "Adam": {"lr": 5e-3, "weight_decay": 0.01},
    # Muon on the weight matrices (the default Newton-Schulz, "gram", and "standard"), AdamW on the biases
    "Muon": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.01, "adam_lr": 3e-3},
    "Muon-standard": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.01, "adam_lr": 3e-3, "ns_method": "standard"},
}


def cases(names):
    for name in names:
        for stage in (0, 1, 2, 3):
            for dtype in ("fp32", "bf16"):
                for offload in ((False, True) if stage > 0 else (False,)):
                    yield name, stage, dtype, offload


def config(name, stage, dtype, offload):
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
           "optimizer": {"type": name.split("-")[0], "params": PARAMS[name]}, "zero_optimization": zero,
           "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(), torch.nn.Linear(48, 40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 3))


def train(cfg, rank):
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=model(), config=cfg)
    dtype = torch.bfloat16 if "bf16" in cfg else torch.float32  # the batch in the model's dtype, as users cast it
    losses = []
    for x, y in batches(rank):
        out = engine(x.to(engine.device, dtype))
        loss = torch.nn.functional.cross_entropy(out.float(), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def batches(rank):
    gen = torch.Generator().manual_seed(1 + rank)
    return [(torch.randn(8, 12, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(STEPS)]


def lamb_reference():
    net = model().double()
    params = list(net.parameters())
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    hp = dict(PARAMS["Lamb"], betas=(0.9, 0.999), eps=1e-8)
    b1, b2 = hp["betas"]
    data = [batches(0), batches(1)]
    losses = []
    for step in range(1, STEPS + 1):
        grads = [torch.zeros_like(p) for p in params]
        for rank in (0, 1):
            x, y = data[rank][step - 1]
            net.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x.double()), y)
            (loss / 2).backward()
            for g, p in zip(grads, params):
                g += p.grad
            if rank == 0:
                losses.append(loss.item())
        norm = torch.sqrt(sum((g * g).sum() for g in grads)).item()
        scale = 1.0 / (norm + 1e-6) if norm > 1.0 else 1.0
        step_size = hp["lr"] * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
        with torch.no_grad():
            for p, g, (m, v) in zip(params, grads, state):
                g = g * scale
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                update = m / (v.sqrt() + hp["eps"]) + hp["weight_decay"] * p
                w_norm, u_norm = p.norm().item(), update.norm().item()
                trust = min(max(w_norm / u_norm, 0.01), 10.0) if w_norm > 0 and u_norm > 0 else 1.0
                p.sub_(step_size * trust * update)
    return losses


def main():
    out, names = sys.argv[1], sys.argv[2:]
    if names == ["--lamb-reference"]:
        with open(out, "w") as f:
            json.dump({"losses": lamb_reference()}, f)
        return
    record(out, ((f"{name} stage {stage} {dtype}{' offload' if offload else ''}",
                  lambda rank, c=config(name, stage, dtype, offload): {"losses": train(c, rank)})
                 for name, stage, dtype, offload in cases(names)))


def record(out, runs):
    """Runs each (key, fn(rank) -> result dict) on every rank; rank 0 writes OUT.json with
    each key's result, or the error it raised (the reference's refusals are recorded, not fatal)."""
    import deepspeed
    from deepspeed import comm as dist
    deepspeed.init_distributed()
    rank = dist.get_rank()
    results = {}
    for key, fn in runs:
        try:
            results[key] = fn(rank)
        except Exception as e:
            results[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
