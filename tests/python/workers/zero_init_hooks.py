"""zero.Init's construction hooks, as DeepSpeed's: each rank builds with its own
seed, yet every rank ends with rank 0's values; Module.apply inside the context
sees whole parameters and rank 0's writes win; a subclass that changes what its
base class built keeps its change; a module skip_init builds on the meta device
(its parameters in children) is partitioned at to_empty; with remote_device="nvme" the slices
wait in a file under offload_param's nvme_path."""
import os
import tempfile

import torch
import torch.nn as nn

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

hvd.init()
rank = hvd.rank()


def whole(module):
    params = list(module.parameters())
    assert params and all(hasattr(p, "ds_id") and p.numel() == 0 for p in params), "not partitioned"
    with deepspeed.zero.GatheredParameters(params):
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Scaled(nn.Linear):
    def __init__(self):
        super().__init__(5, 3)
        with torch.no_grad():
            self.weight.mul_(0.0).add_(3.0)  # after the base class built it


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = Scaled()
        self.apply(self._init)  # as Transformers 4.x's post_init does

    def _init(self, m):
        if isinstance(m, nn.Linear) and not isinstance(m, Scaled):
            with torch.no_grad():
                m.weight.fill_(10.0 + rank)  # each rank writes its own: rank 0's must win
                m.bias.normal_()


# What rank 0 builds, computed here without chorus: the seed's default init, then the
# apply that overwrites a's weight; a's bias from normal_ continuing rank 0's stream.
torch.manual_seed(0)
want = nn.Linear(4, 6)
Scaled_default = nn.Linear(5, 3)  # consumes the same random numbers as Scaled's base
want_bias = torch.empty(6).normal_()

# The same with the slices in a file under offload_param's nvme_path (remote_device="nvme"):
# written as built, written over by the apply's rank-0 result, read back by GatheredParameters.
folder = tempfile.mkdtemp(prefix="zero-init-nvme-")
nvme = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": folder}}}
for kwargs in ({}, {"remote_device": "nvme", "config_dict_or_path": nvme}):
    torch.manual_seed(rank)
    with deepspeed.zero.Init(**kwargs):
        net = Net()
    staged = [hasattr(p, "ds_staged") and p.ds_tensor.numel() == 0 for p in net.parameters()]
    assert all(staged) if kwargs else not any(staged), (kwargs, staged)
    got = whole(net)
    assert torch.equal(got["a.weight"], torch.full((6, 4), 10.0)), got["a.weight"]
    assert torch.equal(got["a.bias"], want_bias), (got["a.bias"], want_bias)
    assert torch.equal(got["b.weight"], torch.full((3, 5), 3.0)), got["b.weight"]
    assert torch.equal(got["b.bias"], Scaled_default.bias.detach()), (got["b.bias"], Scaled_default.bias)
assert os.listdir(folder) == [], os.listdir(folder)  # (the staging file is unlinked once open)
os.rmdir(folder)
try:
    deepspeed.zero.Init(remote_device="nvme", config_dict_or_path={"zero_optimization": {"stage": 3}})
    raise AssertionError("remote_device nvme without an nvme_path was accepted")
except ValueError as e:
    assert "offload_param.nvme_path" in str(e), e


class Parent(nn.Module):  # no parameters of its own; children on the device it is given
    def __init__(self, device=None):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(3, 3, device=device), nn.Linear(3, 2, device=device))


with deepspeed.zero.Init():
    lazy = torch.nn.utils.skip_init(Parent)
shapes = [tuple(p.ds_shape) for p in lazy.parameters()]
assert shapes == [(3, 3), (3,), (2, 3), (2,)], shapes
whole(lazy)
print("ok", rank, flush=True)
