"""A node-local checkpoint (checkpoint.use_node_local_storage) loads only at the size and
ZeRO stage it was saved at, each rank reading its own shard: elsewhere it is refused on
every rank, by name. (tests/multihost runs node-local saves across hosts.)

    zero_node_local.py FOLDER
"""
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def make(stage):
    torch.manual_seed(0)
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage}, "checkpoint": {"use_node_local_storage": True}})
    return engine


hvd.init()
first = make(2)
assert first.use_node_local_storage() and not first.load_universal_checkpoint()
first.backward(first(torch.ones(2, 4)).sum())
first.step()
first.save_checkpoint(sys.argv[1])
try:
    make(1).load_checkpoint(sys.argv[1])
    raise AssertionError("a node-local checkpoint loaded at another stage")
except ValueError as e:
    assert "node-local checkpoint" in str(e) and "stage 2" in str(e), e
print(f"node-local refusal ok {hvd.rank()}", flush=True)
