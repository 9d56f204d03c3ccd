"""LAMB over a device engine's fp32 partition, in torch ops (chorus's engine has
CPU LAMB kernels, not device ones). As the engine's own LAMB: each parameter's
trust ratio is over the whole parameter, the squared norms of this rank's pieces
summed over the engine's set; the moments live in the engine's state buffers, so
checkpoints carry them."""
import math

import torch

import chorus.torch as hvd
from chorus.deepspeed.ops.lamb import lamb_moments, lamb_step_size, lamb_trust


class PartitionLamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, bias_correction=True,
                 eps_inside_sqrt=False, max_coeff=10.0, min_coeff=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction, eps_inside_sqrt=eps_inside_sqrt,
                                      max_coeff=max_coeff, min_coeff=min_coeff))
        self._parts = []
        self._calls = 0

    def bind(self, engine):
        """The engine's cores (its own and each MoE expert part's), their pieces and views."""
        from chorus.deepspeed.runtime.engine import _view
        cores = [(engine.core, engine.process_set, engine._core_args[0])]
        cores += [(part.core, part.data_set, engine._group_of(engine.optimizer_groups, part.params))
                  for part in engine._expert_parts]
        self._parts = []
        for core, pset, group_of in cores:
            views = [_view(v, torch.float32) for v in (core.master_view(), core.external_grad_view(),
                                                        core.state_view(0), core.state_view(1))]
            self._parts.append((core, pset, group_of, core.pieces(), views))

    @torch.no_grad()
    def step(self, closure=None):
        self._calls += 1
        for k, (core, pset, group_of, pieces, (master, grads, m, v)) in enumerate(self._parts):
            steps = core.optimizer_steps
            sums = torch.zeros(2 * len(group_of), dtype=torch.float64, device=master.device)
            updates = []
            for param, off, n in pieces:
                g = self.param_groups[group_of[param]]
                p = master[off:off + n]
                u = lamb_moments(p, grads[off:off + n], m[off:off + n], v[off:off + n], g, g["eps_inside_sqrt"])
                sums[2 * param] += p.double().square().sum()
                sums[2 * param + 1] += u.double().square().sum()
                updates.append(u)
            if core.stage > 0 and pset.size() > 1:
                sums = hvd.allreduce(sums, op=hvd.Sum, name=f"chorus.lamb.{k}.{self._calls}",
                                     process_set=pset)
            sums = sums.cpu().tolist()
            for (param, off, n), u in zip(pieces, updates):
                g = self.param_groups[group_of[param]]
                trust = lamb_trust(math.sqrt(sums[2 * param]), math.sqrt(sums[2 * param + 1]), g["max_coeff"],
                                   g["min_coeff"])
                master[off:off + n].sub_(u, alpha=lamb_step_size(g, steps) * trust)
