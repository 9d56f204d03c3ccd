"""The GPU suite's ZeRO worker (tests/gpu/workers/zero_device.py) under torch 2 on the CPU,
where half-precision arithmetic works: the host engine's fp16 path (dynamic loss scaling),
which the GPU comparison uses and torch 1.13 cannot run, at stages 0-3 against the same
engine and one plain process. Not a GPU test."""
import os

from conftest import REPO, chorusrun


def test_zero_device_worker_with_fp16_on_the_cpu():
    out = chorusrun(2, os.path.join(REPO, "tests", "gpu", "workers", "zero_device.py"), "--quick", DS_ACCELERATOR="cpu")
    assert out.count("zero device ok") == 2, out[-3000:]
    for stage in range(4):
        assert f"mlp stage={stage} fp16 offload=none" in out, out[-3000:]
