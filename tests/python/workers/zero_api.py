"""deepspeed.initialize's other paths: client optimizers (translated, or run as
given), config errors, the training dataloader, stage-3 parameter release, and an
engine on a process set that is not every rank. Run on 3 ranks."""
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from zero_common import data, full_params, loss_fn, make_model, reference, tmpdir, train

hvd.init(process_sets="dynamic")
world, rank = hvd.size(), hvd.rank()
assert world == 3
x, y = data(4 * world, 4)
tmp = tmpdir()


def close(got, ref, tol=2e-5):
    err = max((a - b).abs().max().item() for a, b in zip(got, ref))
    assert err < tol, err
    return err


# A client AdamW beside a config optimizer: the client wins, with a warning, and runs on chorus's Adam.
cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
       "zero_optimization": {"stage": 2}}
model = make_model()
client = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg)
text = " ".join(str(w.message) for w in caught)
assert "client optimizer takes precedence" in text and "chorus's SIMD CPU Adam" in text, text
train(engine, x, y, 4)
ref_cfg = dict(cfg, optimizer={"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}})
print(f"client AdamW translated: error {close(full_params(engine, tmp, 'client-adamw'), reference(make_model(), ref_cfg, torch.float32, x, y, 4, world)[0]):.1e}", flush=True)

# An optimizer chorus has no kernel for runs as given on the fp32 partition.
for stage in (1, 3):
    model = make_model()
    client = torch.optim.Adamax(model.parameters(), lr=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client,
                                               config={"train_micro_batch_size_per_gpu": 4,
                                                       "gradient_clipping": 0.3,
                                                       "zero_optimization": {"stage": stage}})
    assert any("cannot be translated" in str(w.message) for w in caught)
    train(engine, x, y, 4)
    ref_model = make_model()
    master = [p.detach().clone().requires_grad_(True) for p in ref_model.parameters()]
    ref_opt = torch.optim.Adamax(master, lr=0.05)
    for step in range(4):
        grads = [torch.zeros_like(m) for m in master]
        for r in range(world):
            ref_model.zero_grad()
            lo = step * 4 * world + r * 4
            (loss_fn(ref_model(x[lo:lo + 4]), y[lo:lo + 4]) / world).backward()
            for g, p in zip(grads, ref_model.parameters()):
                g += p.grad
        for m, g in zip(master, grads):
            m.grad = g
        torch.nn.utils.clip_grad_norm_(master, 0.3)
        ref_opt.step()
        with torch.no_grad():
            for p, m in zip(ref_model.parameters(), master):
                p.copy_(m)
    print(f"stage {stage}: Adamax as given, error {close(full_params(engine, tmp, f'adagrad-{stage}'), master):.1e}",
          flush=True)

# Config errors name the problem.
# A typo at the top level DeepSpeed ignores: a warning with the nearest key; inside a section it validates, an error.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    deepspeed.initialize(model=make_model(), config={"train_batch_size": 3, "zero_optimisation": {"stage": 1}})
assert any("did you mean 'zero_optimization'" in str(w.message) for w in caught), [str(w.message) for w in caught]
for bad, expect in [({"train_batch_size": 3, "zero_optimization": {"stgae": 1}},
                     "did you mean 'zero_optimization.stage'"),
                    ({"train_batch_size": 6, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
                     "fp16 and bf16 cannot both be enabled"),
                    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
                     "10 != 2 * 2 * 3"),
                    ({"optimizer": {"type": "Adam"}}, "train_batch_size or train_micro_batch_size_per_gpu"),
                    ({"train_batch_size": 3, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
                     "offload_param.nvme_path' is needed"),
                    ({"train_batch_size": 3, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}},
                     "offload_optimizer.nvme_path' is needed")]:
    try:
        deepspeed.initialize(model=make_model(), config=bad)
        raise AssertionError(f"{bad} was accepted")
    except ValueError as e:
        assert expect in str(e), str(e)
print("config errors ok", flush=True)

# training_data gives a sharded loader of micro-batches.
dataset = torch.utils.data.TensorDataset(x, y)
engine, _, loader, _ = deepspeed.initialize(model=make_model(), training_data=dataset,
                                            config={"train_batch_size": 6, "optimizer": {"type": "Adam"}})
assert len(loader) == len(dataset) // world // 2 and next(iter(loader))[0].shape[0] == 2

# Stage 3: outside forward/backward only the persistent (small) parameters stay whole.
cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 41}}
engine, _, _, _ = deepspeed.initialize(model=make_model(), config=cfg)
train(engine, x, y, 2)
small = sum(p.numel() * 4 for p in make_model().parameters() if p.numel() < 41)
assert all(p.numel() == 0 for p in engine.module.parameters() if p.dim() == 2), "weights still gathered"
assert engine._stage3.traced and engine._stage3.prefetched > 0  # later passes gather ahead
assert engine.core.live_bytes >= small and engine.core.live_bytes < 2 * small + 1024, engine.core.live_bytes
with torch.no_grad():
    engine.eval()
    engine(x[:4])
assert all(p.numel() == 0 for p in engine.module.parameters() if p.dim() == 2)
print("stage 3 releases ok", flush=True)

# An engine on ranks {0, 1} only; rank 2 trains nothing and is not disturbed.
pair = hvd.add_process_set([0, 1])
if pair.included():
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 5e-3}},
           "zero_optimization": {"stage": 2}}
    engine, _, _, _ = deepspeed.initialize(model=make_model(), config=cfg, process_set=pair)
    x2, y2 = data(8, 4)
    train(engine, x2, y2, 4)
    got = [p.detach() for p in engine.module.parameters()]
    close(got, reference(make_model(), cfg, torch.float32, x2, y2, 4, 2)[0])
hvd.barrier()
print("zero api ok", flush=True)
