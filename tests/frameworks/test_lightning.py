"""Lightning's DeepSpeed strategy over chorus.deepspeed. Lightning lets it run only
on CUDA GPUs (its setup_environment refuses any other accelerator); on the CPU
what runs is Lightning finding DeepSpeed (the alias's distribution and version
pass its requirement checks), building the strategy and its DeepSpeed config,
and refusing the CPU with its own message. Training under it is in the GPU suite."""
import subprocess

import pytest

from conftest import PYTHON, run

CODE = r"""
import torch, lightning.pytorch as pl
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE
assert bool(_DEEPSPEED_AVAILABLE), _DEEPSPEED_AVAILABLE
s = DeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True)
z = s.config["zero_optimization"]
assert z["stage"] == 3 and z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu", z
import deepspeed, chorus.deepspeed
assert deepspeed is chorus.deepspeed
class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 1)
    def training_step(self, b, i):
        return self.l(b[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
try:
    pl.Trainer(accelerator="cpu", devices=1, strategy=s, max_steps=1, logger=False,
               enable_checkpointing=False, enable_progress_bar=False).fit(M(), data)
except RuntimeError as e:
    assert "only supported on CUDA GPUs" in str(e), e
    print("lightning refuses the CPU:", e)
else:
    raise SystemExit("Lightning trained on the CPU: its refusal is gone, so this test must train and check now")
"""


HAS_GPU = subprocess.run([PYTHON, "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"]).returncode


@pytest.mark.skipif(HAS_GPU, reason="a GPU: Lightning would train; this checks the CPU, where it refuses")
def test_lightning_finds_chorus_deepspeed():
    out = run([PYTHON, "-c", CODE])
    assert "lightning refuses the CPU" in out, out
