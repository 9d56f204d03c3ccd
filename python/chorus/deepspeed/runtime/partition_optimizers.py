"""Lion, Adagrad and LAMB over a device engine's fp32 partition, in torch ops (chorus's
engine has CPU kernels for them, not device ones), as the engine's own kernels step them:
the moments live in the engine's state buffers (so checkpoints carry them, under the
optimizer's own kind), Lion and Adagrad run elementwise over each run of the partition,
and LAMB takes each parameter's trust ratio over the whole parameter, the squared norms
of this rank's pieces summed over the engine's set."""
import math

import torch

import chorus.torch as hvd
from chorus.deepspeed.ops.adagrad import adagrad_update
from chorus.deepspeed.ops.lamb import lamb_moments, lamb_step_size, lamb_trust
from chorus.deepspeed.ops.lion import lion_update
from chorus.deepspeed.runtime.views import view as _view


class _PartitionOptimizer(torch.optim.Optimizer):
    """param_groups as the engine's groups; bind() points it at the engine's partitions."""

    def __init__(self, params, **defaults):
        super().__init__(params, defaults)
        self._parts = []
        self._calls = 0

    def bind(self, engine):
        cores = [(engine.core, engine.process_set, engine._core_args[0])]
        cores += [(part.core, part.data_set, engine._group_of(engine.optimizer_groups, part.params))
                  for part in engine._expert_parts]
        self._parts = []
        for core, pset, group_of in cores:
            views = [None if v is None else _view(v, torch.float32)
                     for v in (core.master_view(), core.external_grad_view(), core.state_view(0), core.state_view(1))]
            self._parts.append((core, pset, group_of, views))

    @torch.no_grad()
    def step(self, closure=None):
        self._calls += 1
        for k, (core, pset, group_of, views) in enumerate(self._parts):
            self._step_part(k, core, pset, group_of, *views)


class PartitionLion(_PartitionOptimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)

    def _step_part(self, k, core, pset, group_of, master, grads, m, _):
        for off, n, gi in core.runs():
            g = self.param_groups[gi]
            lion_update(master[off:off + n], grads[off:off + n], m[off:off + n], g["lr"], g["betas"][0],
                        g["betas"][1], g["weight_decay"])


class PartitionAdagrad(_PartitionOptimizer):
    """torch.optim.Adagrad's update (lr_decay, initial_accumulator_value included)."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10):
        super().__init__(params, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                         initial_accumulator_value=initial_accumulator_value, eps=eps)

    def _step_part(self, k, core, pset, group_of, master, grads, sums, _):
        step = core.optimizer_steps
        for off, n, gi in core.runs():
            g = self.param_groups[gi]
            p, s, grad = master[off:off + n], sums[off:off + n], grads[off:off + n]
            if step == 1 and g["initial_accumulator_value"]:
                s.fill_(g["initial_accumulator_value"])
            adagrad_update(p, grad, s, g["lr"] / (1 + (step - 1) * g["lr_decay"]), g["eps"], g["weight_decay"])


class PartitionLamb(_PartitionOptimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, bias_correction=True,
                 eps_inside_sqrt=False, max_coeff=10.0, min_coeff=0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         bias_correction=bias_correction, eps_inside_sqrt=eps_inside_sqrt, max_coeff=max_coeff,
                         min_coeff=min_coeff)

    def _step_part(self, k, core, pset, group_of, master, grads, m, v):
        steps, pieces = core.optimizer_steps, core.pieces()
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
            sums = hvd.allreduce(sums, op=hvd.Sum, name=f"chorus.lamb.{k}.{self._calls}", process_set=pset)
        sums = sums.cpu().tolist()
        for (param, off, n), u in zip(pieces, updates):
            g = self.param_groups[group_of[param]]
            trust = lamb_trust(math.sqrt(sums[2 * param]), math.sqrt(sums[2 * param + 1]), g["max_coeff"],
                               g["min_coeff"])
            master[off:off + n].sub_(u, alpha=lamb_step_size(g, steps) * trust)


CLASSES = {"lion": PartitionLion, "adagrad": PartitionAdagrad, "lamb": PartitionLamb}
