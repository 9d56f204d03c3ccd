"""Shared by the MoE workers: a small model around one MoE layer whose experts
each get weights of their own, and each rank's batches."""
import torch
import torch.nn.functional as F

from chorus.deepspeed.moe.layer import MoE

E, M, C, MB = 4, 8, 3, 8


class Net(torch.nn.Module):
    """ep_rank: which experts this copy holds (ep_rank * E/ep onwards); seed: the experts' weights."""

    def __init__(self, ep, k, drop, ep_rank, seed=100):
        super().__init__()
        torch.manual_seed(seed)
        self.fc_in = torch.nn.Linear(M, M)
        expert = torch.nn.Sequential(torch.nn.Linear(M, 12), torch.nn.Tanh(), torch.nn.Linear(12, M))
        self.moe = MoE(M, expert, num_experts=E, ep_size=ep, k=k, min_capacity=2, drop_tokens=drop, use_rts=False,
                       top2_2nd_expert_sampling=False)
        self.fc_out = torch.nn.Linear(M, C)
        L = E // ep
        for j, e in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
            g = torch.Generator().manual_seed(seed + ep_rank * L + j)
            with torch.no_grad():
                for p in e.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x, y):
        h, l_aux, _ = self.moe(torch.tanh(self.fc_in(x)))
        return F.cross_entropy(self.fc_out(h), y) + 0.01 * l_aux


def batch(step, r):
    g = torch.Generator().manual_seed(10 * step + r)
    return torch.randn(MB, M, generator=g), torch.randint(0, C, (MB,), generator=g)
