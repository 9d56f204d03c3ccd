"""DeepSpeed 0.19.8's Muon optimizer over chorus's ZeRO partition.

As DeepSpeed: a parameter takes Muon when it is a matrix (2 or more dimensions) whose
name holds neither "embed" nor "lm_head"; the others take the auxiliary AdamW. Each
config or client group is split in its Muon half (lr, momentum, weight_decay,
ns_method; muon_lr overrides lr) and its Adam half (lr, betas, eps, weight_decay;
adam_lr overrides lr). Without ZeRO the optimizer orthogonalizes the clipped gradient;
at ZeRO stages the engine orthogonalizes each matrix's whole reduced gradient before the
norm, so the clip covers the update, and the optimizer only applies it. A ZeRO rank
keeps the momentum of each matrix it holds a piece of, whole, in the model's dtype
(DeepSpeed's, which runs Muon on the partition's gradients), and advances it only when
the step is taken."""
import torch

import chorus.torch as hvd
from chorus.deepspeed.ops.muon import NS_METHODS, muon_update
from chorus.deepspeed.runtime.partition_optimizers import _PartitionOptimizer

MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method")
_PART = 1 << 32  # (checkpoint keys: an expert group's parameters after the shared ones)
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}
CONFIG_PARAMS = MUON_KEYS + ADAM_KEYS + ("muon_lr", "adam_lr", "adam_w_mode", "torch_adam", "fp32_optimizer_states",
                                         "per_head_muon")


def mark(model):
    """DeepSpeed's use_muon flag on every parameter of the model."""
    for name, p in model.named_parameters():
        p.use_muon = p.dim() >= 2 and not any(word in name.lower() for word in ("embed", "lm_head"))


def param_groups(model_params, params):
    """The groups' Muon and Adam halves, settings from the config, then muon_lr/adam_lr, then the group's own."""
    groups, loose = [], []
    for item in model_params:
        (groups if isinstance(item, dict) else loose).append(item)
    if loose or not groups:
        groups.append({"params": loose})
    untagged = [p for g in groups for p in g["params"] if not hasattr(p, "use_muon")]
    if untagged:
        raise ValueError(f"DeepSpeed config: optimizer Muon needs every parameter tagged with use_muon, and "
                         f"{len(untagged)} are not (model_parameters holds parameters the model does not); set "
                         "p.use_muon on them")
    out = []
    for use_muon, keys, defaults, override in ((True, MUON_KEYS, MUON_DEFAULTS, "muon_lr"),
                                              (False, ADAM_KEYS, ADAM_DEFAULTS, "adam_lr")):
        settings = dict(defaults, **{k: params[k] for k in keys if k in params})
        if override in params:
            settings["lr"] = params[override]
        for g in groups:
            half = [p for p in g["params"] if p.requires_grad and bool(p.use_muon) is use_muon]
            if half:
                out.append(dict(settings, **{k: v for k, v in g.items() if k in keys}, params=half,
                                use_muon=use_muon))
    for g in out:
        if g["use_muon"] and g["ns_method"] not in NS_METHODS:
            raise ValueError(f"DeepSpeed config: 'optimizer.params.ns_method' {g['ns_method']!r} is not one of "
                             f"{list(NS_METHODS)}")
        if "betas" in g:
            g["betas"] = tuple(float(b) for b in g["betas"])
    # DeepSpeed's ZeRO lists the Muon halves after the Adam ones; the order only names the groups.
    return out


class PartitionMuon(_PartitionOptimizer):
    """Muon and its auxiliary AdamW over the engine's fp32 partitions (the shared
    parameters' and, with MoE, each expert group's over its expert-data-parallel set): the
    Adam moments in the engines' two state buffers, Muon's momentum here (a state of its
    own, which checkpoints carry beside the shard)."""

    own_state = True

    def __init__(self, groups, shapes, model_dtype, adam_w_mode=True):
        super().__init__([dict({k: v for k, v in g.items() if k != "params"}, params=[torch.zeros(1)])
                          for g in groups])
        self._shapes, self._dtype, self._adam_w_mode = shapes, model_dtype, adam_w_mode
        self._momentum, self._staged = {}, {}  # (part, parameter) -> momentum

    def bind(self, engine):
        super().bind(engine)
        from chorus.deepspeed.runtime.muon_heads import heads_of
        params = [engine._params] + [part.params for part in engine._expert_parts]
        shapes = [self._shapes] + [[tuple(p.shape) for p in part.params] for part in engine._expert_parts]
        self._info = []
        for k, (core, pset, group_of, _) in enumerate(self._parts):
            muon = [self.param_groups[g]["use_muon"] for g in group_of]
            where = {}  # Muon parameter -> every (rank, offset in it, partition offset, count)
            for r in (range(pset.size()) if core.stage > 0 else [0]):
                for param, poff, off, n in core.pieces_of(r):
                    if muon[param]:
                        where.setdefault(param, []).append((r, poff, off, n))
            me = pset.rank() if core.stage > 0 else 0
            self._info.append({
                "shapes": shapes[k], "where": where,
                "heads": [heads_of(p, s[0]) if len(s) == 2 else None for p, s in zip(params[k], shapes[k])],
                "mine": [(param, poff, off, n) for param, poff, off, n in core.pieces_of(me) if muon[param]]})
        # DeepSpeed's ZeRO runs Muon on the partition's gradients (the model's dtype); without ZeRO on fp32 ones.
        self._mdtype = self._dtype if engine.core.stage > 0 else torch.float32

    def before_norm(self):
        """ZeRO stages: each Muon matrix's update in place of this rank's pieces of its gradient."""
        for k, (core, pset, _, (master, grads, _, _)) in enumerate(self._parts):
            if core.stage > 0:
                self._updates(k, core, pset, grads)

    def _updates(self, k, core, pset, grads):
        dtype, info = self._mdtype, self._info[k]
        self._calls += 1
        part = grads.numel()
        every = grads
        if core.stage > 0 and pset.size() > 1:
            every = hvd.allgather(grads.clone(), name=f"chorus.muon.{k}.{self._calls}", process_set=pset)
        done = {}
        for param, poff, off, n in info["mine"]:
            if param not in done:
                shape = torch.Size(info["shapes"][param])
                full = torch.empty(shape.numel(), dtype=torch.float32, device=grads.device)
                for r, q, o, c in info["where"][param]:
                    full[q:q + c] = every[r * part + o:r * part + o + c]
                momentum = self._momentum.get((k, param))
                momentum = torch.zeros(shape, dtype=dtype, device=grads.device) if momentum is None \
                    else momentum.clone()
                g = self.param_groups[self._parts[k][2][param]]
                done[param] = muon_update(full.view(shape).to(dtype), momentum, g["momentum"],
                                          ns_method=g["ns_method"], num_heads=info["heads"][param]).reshape(-1).float()
                self._staged[(k, param)] = momentum
            grads[off:off + n] = done[param][poff:poff + n]

    def _step_part(self, k, core, pset, group_of, master, grads, m, v):
        if core.stage == 0:  # no ZeRO: the clipped gradient, orthogonalized here in fp32
            self._updates(k, core, pset, grads)
        self._momentum.update({key: t for key, t in self._staged.items() if key[0] == k})  # the step is taken
        self._staged = {key: t for key, t in self._staged.items() if key[0] != k}
        step = core.optimizer_steps
        for off, n, gi in core.runs():
            g = self.param_groups[gi]
            p, grad = master[off:off + n], grads[off:off + n]
            if g["use_muon"]:
                p.mul_(1 - g["lr"] * g["weight_decay"])
                p.add_(grad, alpha=-g["lr"])
                continue
            b1, b2 = g["betas"]
            if not self._adam_w_mode:
                grad = grad.add(p, alpha=g["weight_decay"])
            m[off:off + n].lerp_(grad, 1 - b1)
            v[off:off + n].lerp_(grad.square(), 1 - b2)
            update = (m[off:off + n] / (1 - b1 ** step)) / ((v[off:off + n] / (1 - b2 ** step)).sqrt() + g["eps"])
            if self._adam_w_mode:
                p.mul_(1 - g["lr"] * g["weight_decay"])
            p.add_(update, alpha=-g["lr"])

    def state_dict(self):
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        # The shared parameters' by their index (as before MoE); expert group k's at k * _PART + index.
        return {"state": {k * _PART + i: {"momentum_buffer": t.float()} for (k, i), t in self._momentum.items()},
                "param_groups": groups}

    def load_state_dict(self, state_dict):
        device = self._parts[0][3][0].device
        self._momentum = {}
        for key, s in state_dict["state"].items():
            k, i = divmod(int(key), _PART)
            self._momentum[(k, i)] = s["momentum_buffer"].to(device, self._mdtype)
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
