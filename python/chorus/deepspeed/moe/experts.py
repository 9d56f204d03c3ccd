"""deepspeed.moe.experts: this rank's experts, copies of one module."""
import copy

import torch

_MARKS = ("model_parallel", "tensor_model_parallel", "partition_dim", "partition_stride")


class Experts(torch.nn.Module):
    """num_local_experts copies of expert. Their parameters carry allreduce=False and
    the expert group's name: the engine reduces their gradients over the
    expert-data-parallel set instead of every rank."""

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = torch.nn.ModuleList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        # deepcopy drops a Parameter's attributes: keep the tensor-parallel marks
        # (a sliced expert's norm and checkpoint need them).
        marks = [{k: v for k, v in vars(p).items() if k in _MARKS} for p in expert.parameters()]
        for e in self.deepspeed_experts:
            for p, mark in zip(e.parameters(), marks):
                p.__dict__.update(mark)
                p.allreduce = False
                p.group_name = expert_group_name

    def forward(self, inputs):
        """inputs [ep, local experts, capacity, model]: expert j gets [:, j]."""
        outs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1), self.deepspeed_experts):
            out = expert(chunk)
            outs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outs, dim=1)
