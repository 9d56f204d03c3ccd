"""DeepSpeed's ZenFlow (zero_optimization.zenflow) over chorus's ZeRO-1/2 engine with the
optimizer offloaded to the CPU, as DeepSpeed 0.19.8 runs it:

- every micro-step, the top-k "important" columns of each matrix (input features, chosen
  by the summed |gradient| of each column at selection steps) and every vector parameter
  take a torch AdamW step where the model lives, from that micro-step's averaged gradient;
- every update_interval micro-steps (the accumulation boundary), the whole partition takes
  DeepSpeed's CPU AdamW step on the accumulated, clipped gradient, its bias correction
  counting micro-steps. With overlap_step that step runs on a worker thread while training
  goes on, with two sets of moments used alternately, and its result reaches the model one
  boundary later (the first boundary after warm-up waits for none, as DeepSpeed's does);
  the selected columns keep their selective values across that copy.

The engine's fp32 master holds what the model is given at each boundary; the trajectory
the CPU step follows, the second moments set and the selective optimizer's state are this
module's, and checkpoints carry them beside the shard."""
import concurrent.futures

import torch

import chorus.torch as hvd
from chorus import _core
from chorus.deepspeed.runtime.partition_optimizers import _PartitionOptimizer

_KEYS = ("topk_ratio", "select_strategy", "select_interval", "update_interval", "overlap_step", "offload",
         "auto_ratio", "full_warm_up_rounds", "pt_reserved_cores_perc", "steps_per_epoch")


def _refuse(key, why):
    raise ValueError(f"DeepSpeed config: 'zero_optimization.zenflow{'.' + key if key else ''}': {why}")


def _number(section, key, default, kind):
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        _refuse(key, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


class Settings:
    """The section, checked as DeepSpeed's ZenFlowConfig and configure_zenflow check it."""

    def __init__(self, section, raw):
        if not isinstance(section, dict):
            _refuse("", f"expected an object, got {type(section).__name__}")
        unknown = sorted(set(section) - set(_KEYS))
        if unknown:
            _refuse(unknown[0], f"unknown key (ZenFlow's keys: {', '.join(_KEYS)})")
        self.topk_ratio = _number(section, "topk_ratio", 0.1, float)
        if not 0.0 < self.topk_ratio < 1.0:
            _refuse("topk_ratio", f"must be above 0 and below 1, got {self.topk_ratio}")
        self.strategy = section.get("select_strategy", "auto")
        if self.strategy not in ("auto", "step", "epoch"):
            _refuse("select_strategy", f"must be \"auto\", \"step\" or \"epoch\", got {self.strategy!r}")
        select = section.get("select_interval", "auto")
        if isinstance(select, str) and select != "auto":
            _refuse("select_interval", f"a string must be \"auto\", got {select!r}")
        if self.strategy == "auto":
            if not isinstance(select, str):
                _refuse("select_interval", "with select_strategy \"auto\" the selection is once per epoch; "
                                           "remove select_interval or choose \"step\" or \"epoch\"")
            self.strategy, select = "epoch", 1
        elif isinstance(select, str):
            _refuse("select_interval", f"with select_strategy {self.strategy!r} it must be a number")
        self.select_every = _number({"select_interval": select}, "select_interval", 1, int)  # (resolved below)
        update = section.get("update_interval", "auto")
        if isinstance(update, str):
            if update != "auto":
                _refuse("update_interval", f"a string must be \"auto\", got {update!r}")
            _refuse("update_interval", "\"auto\" is not in chorus: DeepSpeed 0.19.8 then divides each loss by "
                                       "an accumulation count of 0 and trains on NaN; give a number of micro-steps")
        self.update_interval = _number(section, "update_interval", 0, int)
        if self.update_interval < 1:
            _refuse("update_interval", f"must be at least 1, got {update}")
        if self.strategy == "step":
            self.resolve(None)
        self.warm_up = _number(section, "full_warm_up_rounds", 0, int)
        if self.warm_up < 0:
            _refuse("full_warm_up_rounds", f"must be 0 or more, got {self.warm_up}")
        self.overlap = bool(section.get("overlap_step", False))
        self.offload = bool(section.get("offload", False))
        zero = raw.get("zero_optimization") or {}
        if self.offload and not zero.get("overlap_comm", False):
            _refuse("offload", "the selective optimizer's states go to the CPU only with "
                               "zero_optimization.overlap_comm true, as in DeepSpeed")
        stage = int(zero.get("stage", 0))
        if stage not in (1, 2):
            _refuse("", f"ZenFlow runs at ZeRO stage 1 or 2 in chorus (stage {stage} given; DeepSpeed's stage-3 "
                        "ZenFlow is not in chorus yet)")
        if str((zero.get("offload_optimizer") or {}).get("device", "none")).lower() != "cpu":
            _refuse("", "ZenFlow needs zero_optimization.offload_optimizer.device \"cpu\", as in DeepSpeed")
        if zero.get("compute_grad_norm") is False:
            _refuse("", "zero_optimization.compute_grad_norm false does not support ZenFlow, as in DeepSpeed")
        if (raw.get("fp16") or {}).get("enabled"):
            _refuse("", "ZenFlow with fp16: DeepSpeed 0.19.8's selective update steps the loss-scaled gradients "
                        "without unscaling them; use bf16")

    def resolve(self, dataloader):
        """select_interval in micro-steps (0: once, at the end of warm-up), as DeepSpeed resolves it."""
        every = self.select_every
        if self.strategy == "epoch":
            every = every * len(dataloader) if dataloader is not None else 0
        if every and every < self.update_interval:
            _refuse("select_interval", f"selection every {every} micro-steps is shorter than update_interval "
                                       f"{self.update_interval}; it must be at least that")
        return every


def _selective_adamw(params, grads, m, v, steps, group):
    b1, b2 = group["betas"]
    torch.optim._functional.adamw(params, grads, m, v, [], steps, foreach=False, amsgrad=False, beta1=b1, beta2=b2,
                                  lr=float(group["lr"]), weight_decay=float(group["weight_decay"]),
                                  eps=float(group["eps"]), maximize=False)


class ZenFlow:
    """The engine's ZenFlow: the boundaries, the selection and the selective AdamW."""

    def __init__(self, engine, settings, groups):
        self.engine, self.s = engine, settings
        self.group_of = engine._group_of(groups)
        self.micro_step = -1
        self.select_interval = None
        for i, shape in enumerate(engine._shapes):
            if len(shape) > 2:
                raise ValueError(f"DeepSpeed config: 'zero_optimization.zenflow': parameter "
                                 f"'{engine._names[i]}' has {len(shape)} dimensions; ZenFlow selects columns of "
                                 "matrices and steps vectors whole (DeepSpeed's does not handle more)")
        self.columns = self._columns()
        self.indices = {}  # matrix -> its selected columns (sorted)
        self.state = {}    # parameter -> (step, exp_avg, exp_avg_sq) of the selected part
        self.pending = {}  # parameter -> this micro-step's gradient (the selected part, or whole at selection)
        self.saved = {}    # parameter -> its selected values before a boundary's copy
        self.lrs = [float(g["lr"]) for g in groups]

    def _columns(self):
        """Each matrix's column ranges within DeepSpeed's partitions (the transposed flat
        layout of its ZenFlow, each group padded to 2 x ranks elements): top-k is taken per range."""
        e = self.engine
        ranks = e.process_set.size()
        out = {}
        group_of = self.group_of
        for gi in sorted(set(group_of)):
            members = [i for i in range(len(e._params)) if group_of[i] == gi]
            total = sum(int(torch.Size(e._shapes[i]).numel()) for i in members)
            align = 2 * ranks
            part = (total + align - 1) // align * align // ranks
            start = 0
            for i in members:
                n = int(torch.Size(e._shapes[i]).numel())
                if len(e._shapes[i]) == 2:
                    rows = e._shapes[i][0]
                    ranges = []
                    for r in range(ranks):
                        lo, hi = max(start, r * part), min(start + n, (r + 1) * part)
                        if hi <= lo:
                            continue
                        first = (lo - start + rows - 1) // rows
                        last = (hi - start) // rows
                        if last > first:
                            ranges.append((first, last, max(1, int((last - first) * self.s.topk_ratio))))
                    out[i] = ranges
                start += n
        return out

    # --- the schedule (DeepSpeed's engine and ZenFlowZeroOptimizer) -----------------------------
    def is_boundary(self, m):
        s = self.s
        if m + 1 < s.warm_up:
            return True
        every = self._select_interval()
        return (m + 1 - s.warm_up) % s.update_interval == 0 or (every != 0 and (m + 1) % every == 0)

    def _select_interval(self):
        if self.select_interval is None:
            self.select_interval = self.s.resolve(self.engine.training_dataloader)
        return self.select_interval

    def selects(self, m):
        d = m - self.s.warm_up
        return d >= 0 and (d == 0 or (self._select_interval() != 0 and m % self._select_interval() == 0))

    def backward_prologue(self):
        self.micro_step = self.engine.micro_steps
        self.pending = {}
        if self.selects(self.micro_step):
            if self.micro_step > 0:
                self.engine._client.sync_from_model()
            for step, m, v in self.state.values():
                m.zero_()
                v.zero_()

    def grab(self, i, g):
        """A parameter's local gradient of this micro-step, before the engine takes it."""
        if self.micro_step < self.s.warm_up:
            return
        if g.dim() == 2 and not self.selects(self.micro_step):
            self.pending[i] = g[:, self.indices[i]].contiguous()
        else:
            self.pending[i] = g.detach().clone()

    def after_backward(self, boundary):
        if self.micro_step < self.s.warm_up:
            return
        e = self.engine
        selects = self.selects(self.micro_step)
        for i, shape in enumerate(e._shapes):  # (a parameter without a gradient this micro-step: zeros, as the
            if i not in self.pending:          # engine takes it, so that every rank reduces the same tensors)
                if len(shape) == 2 and not selects:
                    shape = (shape[0], len(self.indices[i]))
                self.pending[i] = torch.zeros(shape, dtype=e.dtype, device=e._device)
        keys = sorted(self.pending)
        grads = [self.pending[i] for i in keys]
        if e.process_set.size() > 1:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average, name=f"chorus.zenflow.{self.micro_step}",
                                          process_set=e.process_set)
        self.pending = dict(zip(keys, grads))
        if selects:
            for i in keys:
                if i in self.columns:
                    self.indices[i] = self._select(self.pending[i], self.columns[i])
                    self.pending[i] = self.pending[i][:, self.indices[i]].contiguous()
        if boundary:
            self.saved = {i: self._values(i).clone() for i in keys}
        else:
            self._step(keys)

    @staticmethod
    def _select(g, ranges):
        # Columns are rows of the transposed matrix: summed there, as DeepSpeed's flat buffer sums them.
        t = g.t().contiguous()
        picked = []
        for first, last, k in ranges:
            top = torch.topk(t[first:last].abs().sum(dim=1), k).indices + first
            picked.append(top.sort().values)
        return torch.cat(picked) if picked else torch.zeros(0, dtype=torch.long)

    def _values(self, i):
        p = self.engine._params[i]
        return p.data[:, self.indices[i]] if i in self.indices else p.data

    def sync_lr(self):
        self.lrs = [float(g["lr"]) for g in self.engine.optimizer.param_groups]

    def after_step(self, boundary):
        """A boundary's selective step, after the CPU step's copy: the selected values saved
        at backward come back, then step (DeepSpeed's selective_optimizer_step)."""
        if boundary and self.pending:
            keys = sorted(self.pending)
            for i in keys:
                saved = self.saved.pop(i, None)
                if saved is not None and i in self.indices:
                    self.engine._params[i].data[:, self.indices[i]] = saved
                elif saved is not None:
                    self.engine._params[i].data.copy_(saved)
            self._step(keys)
        self.saved = {}

    @torch.no_grad()
    def _step(self, keys):
        e = self.engine
        group_of = self.group_of
        by_group = {}
        for i in keys:
            by_group.setdefault(group_of[i], []).append(i)
        for gi, members in by_group.items():
            group = dict(e.optimizer.param_groups[gi], lr=self.lrs[gi])
            values, grads, ms, vs, steps = [], [], [], [], []
            for i in members:
                x = self._values(i)
                if i not in self.state:
                    where = "cpu" if self.s.offload else x.device
                    self.state[i] = (torch.zeros((), dtype=torch.float32),
                                     torch.zeros(x.shape, dtype=x.dtype, device=where),
                                     torch.zeros(x.shape, dtype=x.dtype, device=where))
                step, m, v = self.state[i]
                values.append(x)
                grads.append(self.pending[i])
                ms.append(m.to(x.device))
                vs.append(v.to(x.device))
                steps.append(step)
            _selective_adamw(values, grads, ms, vs, steps, group)
            for i, x, m, v in zip(members, values, ms, vs):
                if i in self.indices:
                    e._params[i].data[:, self.indices[i]] = x
                _, m0, v0 = self.state[i]
                if m0 is not m:  # (offloaded: back to host memory)
                    m0.copy_(m)
                    v0.copy_(v)
        self.pending = {}

    def state_dict(self):
        out = {"micro_step": self.micro_step, "lrs": self.lrs,
               "indices": {str(i): t.tolist() for i, t in self.indices.items()}}
        out["selective"] = {str(i): [float(s), m.float(), v.float()] for i, (s, m, v) in self.state.items()}
        return out

    def load_state_dict(self, sd):
        self.micro_step = int(sd["micro_step"])
        self.lrs = [float(x) for x in sd["lrs"]]
        self.indices = {int(i): torch.tensor(t, dtype=torch.long) for i, t in sd["indices"].items()}
        self.state = {}
        for i, (step, m, v) in sd["selective"].items():
            x = self._values(int(i))
            where = "cpu" if self.s.offload else x.device
            self.state[int(i)] = (torch.tensor(float(step)), m.to(where, x.dtype), v.to(where, x.dtype))


class ZenFlowCPUAdam(_PartitionOptimizer):
    """The boundary's step over the engine's fp32 partition: DeepSpeed's CPU AdamW (chorus's
    SIMD kernel), bias correction at micro-step + 1; with overlap_step on a worker thread,
    with two sets of moments (the engine's state buffers and this one's) and the result
    published one boundary later."""

    own_state = True

    def __init__(self, groups, zenflow, adamw):
        super().__init__([dict({k: v for k, v in g.items() if k != "params"}, params=[torch.zeros(1)])
                          for g in groups])
        self.zf, self.adamw = zenflow, adamw
        self._worker = None
        self._tasks = {}  # moments set -> its step in flight
        self.established = False
        self.first_round = True

    def bind(self, engine):
        super().bind(engine)
        self.core, pset, _, (master, grads, m, v) = self._parts[0]
        self.master, self.grads = master, grads
        self.mine = self.core.pieces_of(pset.rank())
        if self.zf.s.overlap:
            self.path = master.clone()  # the CPU step's trajectory (DeepSpeed's fp32 partition)
            self.stale = master.clone()  # its value after the last step: what the model is given
            self.moments = [(m, v), (torch.zeros_like(m), torch.zeros_like(v))]
            self.gbuf = [torch.zeros_like(grads), torch.zeros_like(grads)]
        else:
            self.path, self.moments = master, [(m, v)]

    def _adam(self, path, grads, moments, step, hypers, snapshot=None):
        m, v = moments
        for (off, n, gi), (lr, b1, b2, eps, wd, bc) in zip(self.core.runs(), hypers):
            _core.cpu_adam_step(path[off:].data_ptr(), grads[off:].data_ptr(), m[off:].data_ptr(),
                                v[off:].data_ptr(), n, lr, b1, b2, eps, wd, step,
                                True if self.zf.s.overlap else self.adamw, bias_correction=bc)
        if snapshot is not None:  # (a selection's resync moves the trajectory, not what was computed)
            snapshot.copy_(path)

    def _hypers(self):
        out = []
        for _, _, gi in self.core.runs():
            g = self.param_groups[gi]
            b1, b2 = g["betas"]
            out.append((float(g["lr"]), float(b1), float(b2), float(g["eps"]), float(g["weight_decay"]),
                        bool(g.get("bias_correction", True))))
        return out

    def settle(self):
        """Waits for the steps in flight; raises a failed one's error."""
        tasks, self._tasks = list(self._tasks.values()), {}
        for t in tasks:
            t.result()

    def sync_from_model(self):
        """The trajectory restarts from the model's values (DeepSpeed's sync at a selection)."""
        self.settle()
        self._from_model(self.path)

    def _from_model(self, dst):
        params = self.zf.engine._params
        for param, poff, off, n in self.mine:
            dst[off:off + n].copy_(params[param].data.reshape(-1)[poff:poff + n])

    @torch.no_grad()
    def step(self, closure=None):
        error = None
        try:
            self._step()
        except Exception as e:  # noqa: BLE001 - one rank's failed CPU step fails every rank's step
            error = e
        pset = self._parts[0][1]
        failed = hvd.allreduce(torch.tensor([0 if error is None else 1]), op=hvd.Sum,
                               name="chorus.zenflow.step", process_set=pset)
        if error is not None:
            raise error
        if int(failed.item()):
            raise RuntimeError("model_engine.step(): ZenFlow's CPU step failed on another rank")

    def _step(self):
        m = self.zf.micro_step
        s = self.zf.s
        step = m + 1
        if not s.overlap:  # (the config's Adam or AdamW; the overlapped step is always AdamW, as DeepSpeed's)
            self._adam(self.path, self.grads, self.moments[0], step, self._hypers())
            return
        k = (m & 1) if m < s.warm_up else (m // s.update_interval) & 1
        if m < s.warm_up:
            self._submit(k, step)
            copied = self._wait_and_copy(m)
        else:
            copied = self._wait_and_copy(m)
            self._submit(k, step)
        if not copied:  # the model keeps its values: the master is published as they are
            self._from_model(self.master)

    def _submit(self, k, step):
        if k in self._tasks:  # (its buffers are still read by a step in flight)
            self._tasks.pop(k).result()
        self.gbuf[k].copy_(self.grads)
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chorus-zenflow")
        self.established = True
        self._tasks[k] = self._worker.submit(self._adam, self.path, self.gbuf[k], self.moments[k], step,
                                             self._hypers(), self.stale)

    def _wait_and_copy(self, m):
        if not self.established:
            return False
        if m + 1 > self.zf.s.warm_up and self.first_round:
            self.first_round = False
            return False
        self.settle()
        self.master.copy_(self.stale)
        return True

    def state_dict(self):
        self.settle()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        state = {"zenflow": dict(self.zf.state_dict(), established=self.established, first_round=self.first_round)}
        # The model is not the master: the selective steps moved it since the last publish.
        state["model"] = torch.empty_like(self.master)
        self._from_model(state["model"])
        if self.zf.s.overlap:
            state["path"], state["stale"] = self.path.clone(), self.stale.clone()
            state["exp_avg_1"], state["exp_avg_sq_1"] = (t.clone() for t in self.moments[1])
        return {"state": {0: _flatten(state)}, "param_groups": groups}

    def load_state_dict(self, state_dict):
        self.settle()
        state = _unflatten(state_dict["state"][0] if 0 in state_dict["state"] else state_dict["state"]["0"])
        zf = state["zenflow"]
        self.zf.load_state_dict(zf)
        self.established, self.first_round = bool(zf["established"]), bool(zf["first_round"])
        keep = self.master.clone()
        self.master.copy_(state["model"])
        self.core.publish_external()  # (collective: every rank loads its own state)
        self.master.copy_(keep)
        if self.zf.s.overlap:
            self.path.copy_(state["path"])
            self.stale.copy_(state["stale"])
            self.moments[1][0].copy_(state["exp_avg_1"])
            self.moments[1][1].copy_(state["exp_avg_sq_1"])
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})


def _flatten(state):
    """Tensors under their own keys (the client-state file keeps tensors and JSON apart)."""
    out, meta = {}, {}
    zf = dict(state["zenflow"])
    selective = zf.pop("selective")
    for i, (step, m, v) in selective.items():
        out[f"sel_m_{i}"], out[f"sel_v_{i}"] = m, v
        meta[i] = step
    zf["selective"] = meta
    out["zenflow"] = zf
    for key in ("model", "path", "stale", "exp_avg_1", "exp_avg_sq_1"):
        if key in state:
            out[key] = state[key]
    return out


def _unflatten(flat):
    zf = dict(flat["zenflow"])
    zf["selective"] = {i: [step, flat[f"sel_m_{i}"], flat[f"sel_v_{i}"]] for i, step in zf["selective"].items()}
    out = {"zenflow": zf}
    for key in ("model", "path", "stale", "exp_avg_1", "exp_avg_sq_1"):
        if key in flat:
            out[key] = flat[key]
    return out
