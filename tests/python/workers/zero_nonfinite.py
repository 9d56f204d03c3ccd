"""A step whose gradients are not finite, as DeepSpeed 0.19.8 treats it: skipped (the
weights unchanged, skipped_steps counted) with bf16 at every stage unless
bf16.check_grad_overflow is false at a ZeRO stage, and with fp32 at ZeRO stages; applied
by fp32 without ZeRO (its plain optimizer does not look)."""
import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def run(stage, bf16, check=True):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage}}
    if bf16:
        cfg["bf16"] = {"enabled": True, "check_grad_overflow": check}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    before = [p.detach().float().clone() for p in engine.module_state_dict().values()]
    x = torch.ones(2, 4, dtype=torch.bfloat16 if bf16 else torch.float32)
    engine.backward(engine(x).sum() * float("inf"))
    engine.step()
    after = [p.detach().float() for p in engine.module_state_dict().values()]
    unchanged = all(torch.equal(a, b) for a, b in zip(before, after))
    finite = all(bool(torch.isfinite(a).all()) for a in after)
    return engine.skipped_steps, unchanged, finite


hvd.init()
for stage in (0, 1, 2, 3):
    assert run(stage, bf16=True) == (1, True, True), stage
    assert run(stage, bf16=False) == ((1, True, True) if stage else (0, False, False)), stage
for stage in (1, 2):
    skipped, unchanged, finite = run(stage, bf16=True, check=False)
    assert skipped == 0 and not finite, stage
print(f"non-finite steps ok {hvd.rank()}", flush=True)
