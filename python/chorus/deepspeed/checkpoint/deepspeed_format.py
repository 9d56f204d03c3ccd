"""DeepSpeed 0.19.8's checkpoint folder (TAG/), read into whole tensors: each trainable
parameter's fp32 master value and its optimizer state (exp_avg, exp_avg_sq, ...), with
the step count, the 16-bit module and buffers, and the engine's counters.

ZeRO 1-2 (zero_pp_rank_R_mp_rank_00_optim_states.pt, bf16_ prefixed under bf16): each
group's flat fp32 partition and optimizer state, rank after rank, the group's parameters end to
end in param_shapes' order, padding at the end. ZeRO 3 (also zero_pp_rank_R_..._model_
states.pt): every parameter split evenly over the ranks (the last slice padded), each
rank's slices end to end. Without ZeRO: the model states hold the module and the
optimizer (its torch state per parameter, or, under bf16/fp16, DeepSpeed's flat fp32
groups). Files are read through ds_pickle (nothing in them runs); a missing, extra or
truncated rank's file is named."""
import glob
import math
import os
import re

import torch

from chorus.deepspeed.checkpoint.ds_pickle import load
from chorus.deepspeed.runtime.expert_parts import global_name, is_expert_name, local_counts, split_expert_name

MODEL_STATES = "mp_rank_00_model_states.pt"
STAGE3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
ENGINE_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
               "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
               "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
               "ds_version", "checkpoint_parallel_dimensions", "num_experts", "ds_autoep_layers"}


def _cat(tensors):
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def model_states_name(mp, stage3=False):
    return f"zero_pp_rank_0_mp_rank_{mp:02d}_model_states.pt" if stage3 else f"mp_rank_{mp:02d}_model_states.pt"


def is_deepspeed_checkpoint(path):
    return os.path.isfile(os.path.join(path, MODEL_STATES)) or os.path.isfile(os.path.join(path, STAGE3_MODEL_STATES))


def layer_file(idx, tp_rank=None):
    """A pipeline layer's file (DeepSpeed's PipelineModule.ckpt_layer_path): the tensor-parallel
    slice, where there is a model axis, in its name."""
    return f"layer_{idx:02d}" + ("" if tp_rank is None else f"-model_{tp_rank:02d}") + "-model_states.pt"


def layer_files(path):
    """{layer index: {tensor-parallel slice or None: file}} of a pipeline checkpoint."""
    out = {}
    for f in glob.glob(os.path.join(glob.escape(path), "layer_*-model_states.pt")):
        m = re.match(r"layer_(\d+)(?:-model_(\d+))?-model_states\.pt$", os.path.basename(f))
        if m:
            out.setdefault(int(m.group(1)), {})[None if m.group(2) is None else int(m.group(2))] = f
    return out


def expert_optimizer_files(path, mp):
    """{expert-parallel rank: file} of a MoE checkpoint without ZeRO (expp_rank_E_mp_rank_XX_optim_states.pt)."""
    out = {}
    for f in glob.glob(os.path.join(glob.escape(path), f"expp_rank_*_mp_rank_{mp:02d}_optim_states.pt")):
        m = re.match(rf"expp_rank_(\d+)_mp_rank_{mp:02d}_optim_states\.pt$", os.path.basename(f))
        if m:
            out[int(m.group(1))] = f
    if out and sorted(out) != list(range(len(out))):
        raise ValueError(f"load_checkpoint: {path} holds the expert optimizer states of expert-parallel ranks "
                         f"{sorted(out)}; some are missing")
    return out


def expert_files(path, mp):
    """[(MoE layer, global expert, file)] (layer_L_expert_E_mp_rank_XX_model_states.pt)."""
    out = []
    for f in glob.glob(os.path.join(glob.escape(path), f"layer_*_expert_*_mp_rank_{mp:02d}_model_states.pt")):
        m = re.match(rf"layer_(\d+)_expert_(\d+)_mp_rank_{mp:02d}_model_states\.pt$", os.path.basename(f))
        if m:
            out.append((int(m.group(1)), int(m.group(2)), f))
    return sorted(out)


def expert_sets(world, partitions, data_first=False):
    """{expert-parallel rank: its expert-data-parallel ranks, in order} as DeepSpeed's groups place
    them: E + D (default; ranks of one expert-parallel group are neighbours) or D + E."""
    if partitions < 1 or world % partitions:
        raise ValueError(f"load_checkpoint: an expert group in {partitions} partitions over {world} ranks")
    ep = world // partitions
    if data_first:
        return {e: list(range(e * partitions, (e + 1) * partitions)) for e in range(ep)}
    return {e: list(range(e, world, ep)) for e in range(ep)}


class DeepSpeedCheckpoint:
    """One model-parallel slice (mp_rank_XX) of a DeepSpeed checkpoint folder: names/shapes (the
    trainable parameters, in order), fp32 {name: tensor}, states {name: {key: tensor}} (the
    optimizer's per-element state under its own names: exp_avg, exp_avg_sq, momentum_buffer...;
    a key is kept only where every parameter has it), step, param_groups (the optimizer's
    settings as saved), scaler (fp16's loss scaler state, under DeepSpeed's names, or None),
    module (16-bit values and buffers; a pipeline's from its layer files), model_states (the rest
    of the engine's dict), stage, world."""

    def __init__(self, path, untrained=None, mp=0, pipeline_module=None):
        """untrained: the names of the loading model's parameters it does not train (without ZeRO
        the file does not say which of the module's parameters the optimizer held; a name the
        loading model lacks, another pipeline stage's, counts as trained). mp: the slice.
        pipeline_module(model_states): a pipeline slice's module, from the layer files."""
        self.path, self.untrained, self.mp = path, set(untrained or ()), mp
        stage3 = not os.path.isfile(os.path.join(path, model_states_name(mp)))
        self.model_states = load(os.path.join(path, model_states_name(mp, stage3)))
        ms = self.model_states
        self.world = int(ms.get("dp_world_size", 1))
        self.module = ms.get("module")
        self.pipeline = self.module is None
        if self.pipeline:
            if pipeline_module is None:
                raise ValueError(f"load_checkpoint: {path}: {model_states_name(mp, stage3)} holds no module and the "
                                 "folder no pipeline layer files (layer_XX-model_states.pt)")
            self.module = pipeline_module(ms)
        self.stage = int(((ms.get("ds_config") or {}).get("zero_optimization") or {}).get("stage", 3 if stage3 else 0))
        self.states, self.step, self.param_groups, self.scaler = {}, 0, [], None
        self.experts = {}  # MoE: every expert's saved values under its global number
        for _, _, f in expert_files(path, mp):
            self.experts.update(load(f))
        if self.stage == 0:
            self._read_unpartitioned()
        else:
            self._read_partitioned()

    def _data_first(self):
        return bool((self.model_states.get("ds_config") or {}).get("use_data_before_expert_parallelism", False))

    # --- layouts ------------------------------------------------------------------------------
    def _names_from_shapes(self):
        groups = self.model_states.get("param_shapes")
        if not groups:
            raise ValueError(f"load_checkpoint: {self.path}: the model states carry no param_shapes")
        return [[(n, tuple(s)) for n, s in g.items()] for g in groups]

    def _rank_files(self):
        files = {}
        for f in glob.glob(os.path.join(glob.escape(self.path), f"*zero_pp_rank_*_mp_rank_{self.mp:02d}_optim_states.pt")):
            m = re.search(rf"zero_pp_rank_(\d+)_mp_rank_{self.mp:02d}_optim_states\.pt$", f)
            files[int(m.group(1))] = f
        missing = [r for r in range(self.world) if r not in files]
        if missing or len(files) != self.world:
            raise ValueError(f"load_checkpoint: {self.path} was saved by {self.world} data-parallel ranks, but holds "
                             f"optimizer states of ranks {sorted(files)} (missing: {missing})")
        states = [load(files[r])["optimizer_state_dict"] for r in range(self.world)]
        self._same_save(states, files)
        return states

    def _same_save(self, states, files):
        """The ranks' files of one save: the same stage, partition counts and step (a rank's
        file left from another save under the tag would otherwise load silently)."""
        def mark(s):
            inner = s.get("base_optimizer_state") or s.get("optimizer_state_dict") or {}
            steps = sorted({self._step(v, None) for v in (inner.get("state") or {}).values()} - {None})
            stage = s.get("zero_stage")
            stage = getattr(stage, "args", stage)
            return (str(stage), str(s.get("partition_count")), tuple(steps), s.get("ds_version"))

        first = mark(states[0])
        for r, s in enumerate(states[1:], 1):
            if mark(s) != first:
                raise ValueError(f"load_checkpoint: {files[r]} is not of the same save as "
                                 f"{os.path.basename(files[0])} (stage, partition count, step, version: {mark(s)} "
                                 f"against {first}); the folder mixes two saves")

    def _read_partitioned(self):
        groups = self._names_from_shapes()
        states = self._rank_files()
        self.fp32, out = {}, {}
        self._scaler(states[0].get("loss_scaler"))
        if self.stage in (1, 2):
            named = []
            for g, params in enumerate(groups):
                # An expert group's partitions: over the ranks holding the same experts (an
                # expert-parallel rank's expert-data-parallel set), one such set per expert-parallel rank.
                sets = {0: list(range(self.world))}
                if any(is_expert_name(n) for n, _ in params):
                    sets = expert_sets(self.world, int(states[0]["partition_count"][g]), self._data_first())
                counts = local_counts([n for n, _ in params]) if len(sets) > 1 else {}
                for e, ranks in sets.items():
                    mine = [(global_name(n, e, counts) if counts else n, shape) for n, shape in params]
                    flat = _cat([states[r]["single_partition_of_fp32_groups"][g].float() for r in ranks])
                    opt = [states[r]["base_optimizer_state"]["state"].get(g, {}) for r in ranks]
                    paddings = (states[ranks[0]].get("param_alignment_paddings") or [None] * len(groups))[g]
                    self._walk(mine, flat, self._flat_states(opt), out, paddings)
                    self.step = self._step(opt[0], self.step)
                    named += mine
            self.param_groups = states[0]["base_optimizer_state"].get("param_groups") or []
            groups = [named]
        else:
            flats = [_cat([t.float() for t in s["fp32_flat_groups"]]) for s in states]
            opts = [s["optimizer_state_dict"]["state"] for s in states]
            per_rank = [self._flat_states([o[k] for k in sorted(o)]) for o in opts]
            keys = set.intersection(*[set(f) for f in per_rank]) if per_rank else set()
            offset = 0
            for name, shape in [p for g in groups for p in g]:
                numel = math.prod(shape)
                part = math.ceil(numel / self.world)
                short = [r for r in range(self.world) if flats[r].numel() < offset + part]
                if short:
                    raise ValueError(f"load_checkpoint: {self.path}: the fp32 partitions of ranks {short} end before "
                                     f"parameter {name} (which needs {offset + part} values each)")
                pieces = [flats[r][offset:offset + part] for r in range(self.world)]
                self.fp32[name] = _cat(pieces)[:numel].view(shape)
                out[name] = {k: _cat([per_rank[r][k][offset:offset + part] for r in range(self.world)])
                             [:numel].view(shape) for k in keys}
                offset += part
            if opts[0]:
                self.step = self._step(opts[0][sorted(opts[0])[0]], 0)
            self.param_groups = states[0]["optimizer_state_dict"].get("param_groups") or []
        self.names = [n for g in groups for n, _ in g]
        self.shapes = [s for g in groups for _, s in g]
        self._keep(out)

    def _keep(self, out):
        """The state keys every parameter has."""
        common = set.intersection(*[set(out.get(n, {})) for n in self.names]) if self.names else set()
        self.states = {n: {k: v for k, v in out[n].items() if k in common} for n in self.names} if common else {}

    def _scaler(self, record):
        """fp16's loss scaler, as the record of DeepSpeed's (Dynamic)LossScaler or the keys its
        FP16_Optimizer saves without ZeRO."""
        state = getattr(record, "state", None) if record is not None else None
        if isinstance(state, dict) and state.get("dynamic"):
            self.scaler = dict(state)
        elif isinstance(record, dict) and record.get("dynamic_loss_scale") and "cur_scale" in record:
            self.scaler = {"cur_scale": record["cur_scale"], "cur_iter": record.get("cur_iter", 0),
                           "last_overflow_iter": record.get("last_overflow_iter", -1),
                           "cur_hysteresis": record.get("cur_hysteresis"), "dynamic": True}

    def _read_unpartitioned(self):
        files = expert_optimizer_files(self.path, self.mp)
        if not files:
            self.names, self.shapes, self.fp32, out = self._unpartitioned(self.module,
                                                                          self.model_states.get("optimizer") or {})
            self._keep(out)
            return
        # MoE without ZeRO: expert-parallel rank E's optimizer (expp_rank_E) over its module, the
        # shared parameters then its experts (DeepSpeed's MoE parameter groups come last)
        ep, counts = len(files), self._expert_counts()
        self.names, self.shapes, self.fp32, out = [], [], {}, {}
        for e in range(ep):
            module = dict(self.module)
            for prefix, total in counts.items():
                nl = total // ep
                for j in range(nl):
                    for k, v in self.experts.items():
                        at = f"{prefix}.{e * nl + j}."
                        if k.startswith(at):
                            module[f"{prefix}.{j}." + k[len(at):]] = v
            names, shapes, fp32, got = self._unpartitioned(module, load(files[e]).get("optimizer") or {})
            for n, shape in zip(names, shapes):
                if is_expert_name(n) or e == 0:
                    g = global_name(n, e, {p: t // ep for p, t in counts.items()}) if is_expert_name(n) else n
                    self.names.append(g)
                    self.shapes.append(shape)
                    self.fp32[g], out[g] = fp32[n], got[n]
        self._keep(out)

    def _expert_counts(self):
        """{experts' path: how many experts} from the experts' files."""
        counts = {}
        for k in self.experts:
            prefix, number, _ = split_expert_name(k)
            counts[prefix] = max(counts.get(prefix, 0), number + 1)
        return counts

    def _unpartitioned(self, module, opt):
        """(names, shapes, fp32, states) of the trained parameters of a module and its optimizer."""
        buffers = set(self.model_states.get("buffer_names") or [])
        frozen = set((self.model_states.get("frozen_param_shapes") or {}).keys())
        names, seen, every = [], set(), []
        for n in module:  # a tied parameter is saved under each name, one storage: trained once
            t = module[n]
            key = (t.data_ptr(), tuple(t.shape), str(t.dtype))
            if n in buffers or (t.numel() and key in seen):
                continue
            seen.add(key)
            every.append(n)  # (every parameter, in the module's order)
            if n in frozen or n in self.untrained:
                continue
            names.append(n)
        # DeepSpeed's torch optimizer (fp32, no ZeRO) holds what initialize was given: by default
        # every module parameter, frozen ones too; its state is numbered over those.
        held = sum(len(g.get("params", [])) for g in opt.get("param_groups") or [])
        numbered = every if held == len(every) and held != len(names) else names
        shapes = [tuple(module[n].shape) for n in names]
        fp32, out = {}, {}
        if "fp32_groups_flat" in opt:  # DeepSpeed's 16-bit optimizer: flat fp32 groups, params in order
            flat = torch.cat([t.float() for t in opt["fp32_groups_flat"]])
            inner = (opt.get("optimizer_state_dict") or {}).get("state") or {}
            self._walk(list(zip(names, shapes)), flat, self._flat_states([inner[k] for k in sorted(inner)]),
                       out, into=fp32)
            self._scaler(opt)
            if inner:
                self.step = self._step(inner[sorted(inner)[0]], 0)
            self.param_groups = (opt.get("optimizer_state_dict") or {}).get("param_groups") or []
        else:  # a torch optimizer over the module's fp32 parameters
            state = opt.get("state") or {}
            for i, n in enumerate(names):
                fp32[n] = module[n].float().clone()
                out[n] = {k: v.float().clone() for k, v in (state.get(numbered.index(n)) or {}).items()
                          if torch.is_tensor(v) and tuple(v.shape) == tuple(shapes[i])}
            if state:  # (DeepSpeed's CPU FusedAdam leaves step 0 in some parameters' state after stepping)
                self.step = max(self._step(v, 0) for v in state.values())
            if self.step == 0 and any(torch.is_tensor(t) for v in state.values() for t in v.values()):
                self.step = int(self.model_states.get("global_steps", 0)) - int(self.model_states.get("skipped_steps", 0))
            self.param_groups = opt.get("param_groups") or []
        return names, shapes, fp32, out

    # --- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _flat_states(states):
        """{key: the ranks' (or groups') flat state end to end} for the tensor keys all of them have."""
        if not states:
            return {}
        keys = set.intersection(*[{k for k, v in s.items() if torch.is_tensor(v) and v.dim() == 1} for s in states])
        return {k: _cat([s[k].float().reshape(-1) for s in states]) for k in keys}

    @staticmethod
    def _step(state, default):
        step = state.get("step", default) if isinstance(state, dict) else default
        return int(step.item() if torch.is_tensor(step) else step)

    def _walk(self, params, flat, states, out, paddings=None, into=None):
        """Each parameter's values from a flat group (with DeepSpeed's alignment padding after each, if any)."""
        offset = 0
        for k, (name, shape) in enumerate(params):
            numel = math.prod(shape)
            if offset + numel > flat.numel():
                raise ValueError(f"load_checkpoint: {self.path}: the fp32 partitions hold {flat.numel()} values, "
                                 f"fewer than the parameters need ({name} ends at {offset + numel})")
            (self.fp32 if into is None else into)[name] = flat[offset:offset + numel].view(shape)  # (views)
            out[name] = {k: t[offset:offset + numel].view(shape) for k, t in states.items()
                         if t.numel() >= offset + numel}
            offset += numel + (int(paddings[k]) if paddings else 0)

    def frozen(self):
        """{name: whole tensor} of the parameters not trained: in the module (stages 0-2), or
        in pieces in every rank's model states (stage 3's frozen_param_fragments)."""
        shapes = self.model_states.get("frozen_param_shapes") or {}
        if self.stage < 3:
            buffers = set(self.model_states.get("buffer_names") or [])
            trained = set(self.names)
            return {n: t for n, t in self.module.items() if n not in buffers and n not in trained and t.numel()}
        if not shapes:
            return {}
        pieces = {n: [] for n in shapes}
        for r in range(self.world):
            f = os.path.join(self.path, f"zero_pp_rank_{r}_mp_rank_{self.mp:02d}_model_states.pt")
            if not os.path.isfile(f):
                raise ValueError(f"load_checkpoint: {self.path} was saved by {self.world} ranks; {f} is missing")
            fragments = (load(f) if r else self.model_states).get("frozen_param_fragments") or {}
            for n in shapes:
                if n not in fragments:
                    raise ValueError(f"load_checkpoint: {f} holds no piece of the frozen parameter '{n}'")
                pieces[n].append(fragments[n].reshape(-1))
        return {n: torch.cat(pieces[n])[:math.prod(tuple(shapes[n]))].view(tuple(shapes[n])) for n in shapes}

    def client_state(self):
        return {k: v for k, v in self.model_states.items() if k not in ENGINE_KEYS}
