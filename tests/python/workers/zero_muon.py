"""Muon in chorus's ZeRO engine, beyond the losses held to DeepSpeed's
(tests/frameworks/test_optimizers_vs_deepspeed.py):
- the Newton-Schulz iterations against an SVD: singular values near 1, the direction
  of U V^T, for wide, tall and square matrices and both methods;
- its momentum survives save_checkpoint/load_checkpoint (the resumed losses equal the
  uninterrupted run's), and a load at another ZeRO stage is refused by name;
- a step with non-finite gradients is skipped and leaves the momentum where it was:
  the run goes on as if that batch had never come.
"""
import sys

import torch

import chorus.torch as hvd
from chorus.deepspeed.ops.muon import orthogonalize
from zero_client_state import make, resumes, steps


def check_orthogonalize():
    gen = torch.Generator().manual_seed(3)
    for shape in ((8, 20), (20, 8), (12, 12)):
        g = torch.randn(*shape, generator=gen)
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        polar = u @ vh
        for method in ("gram", "standard"):
            x = orthogonalize(g, 5, method).float()
            s = torch.linalg.svdvals(x)
            assert x.shape == g.shape and 0.3 < s.min() and s.max() < 1.3, (shape, method, s)
            cos = (x * polar).sum() / (x.norm() * polar.norm())
            assert cos > 0.9, (shape, method, cos)


MUON = {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.9, "adam_lr": 3e-3}}


def poisoned_step(engine, x):
    engine.backward(engine(x).square().mean() * float("inf"))
    engine.step()


hvd.init()
check_orthogonalize()
resumes(sys.argv[1], MUON)
gen = torch.Generator().manual_seed(hvd.rank())
data = [torch.randn(4, 8, generator=gen) for _ in range(6)]
for stage in (1, 3):  # (without ZeRO an fp32 step is applied as it is, as DeepSpeed's)
    clean = make(stage, MUON)
    want = steps(clean, data)
    skipping = make(stage, MUON)
    got = steps(skipping, data[:2])
    poisoned_step(skipping, data[2])
    got += steps(skipping, data[2:])
    assert skipping.skipped_steps == 1 and clean.skipped_steps == 0
    assert max(abs(a - b) for a, b in zip(want, got)) < 1e-7, (stage, want, got)
print(f"muon ok {hvd.rank()}", flush=True)
