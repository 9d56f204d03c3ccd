"""A DeepSpeed 0.19.8 checkpoint folder of any number of model-parallel slices, read into
whole parameters: each slice (mp_rank_XX: under a pipeline, stage x tensor-parallel rank, the
stage outer) through deepspeed_format.DeepSpeedCheckpoint, its data-parallel ZeRO files
joined there; here the slices are joined. A pipeline's slices hold its stages' parameters
(their 16-bit values in the layer files, layer_XX[-model_YY]-model_states.pt); the slices of
a tensor-parallel parameter are kept apart and cut for the loading engine by `value`."""
import glob
import os
import re

import torch

from chorus.deepspeed.checkpoint.deepspeed_format import DeepSpeedCheckpoint, layer_files
from chorus.deepspeed.checkpoint.ds_pickle import load


def _slices(path):
    found = set()
    for f in glob.glob(os.path.join(glob.escape(path), "*mp_rank_*_model_states.pt")):
        m = re.match(r"(?:zero_pp_rank_0_)?mp_rank_(\d+)_model_states\.pt$", os.path.basename(f))
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


class DeepSpeedFolder:
    """names (every trained parameter, slice by slice), slices, tp, pp, step, param_groups,
    scaler, model_states (slice 0's), world, stage; value(name, ...) for a loading engine's
    piece; frozen() and buffers() by name."""

    def __init__(self, path, untrained=None, layers=None):
        """layers: {pipeline layer index: its parameters' prefix} where not "INDEX." (a tied
        layer's "tied_modules.KEY."), from the loading PipelineModule."""
        self.path, self.prefixes = path, dict(layers or {})
        mps = _slices(path)
        if not mps:
            raise ValueError(f"load_checkpoint: {path} holds no DeepSpeed model states (mp_rank_XX_model_states.pt)")
        self._layer_files = layer_files(path)
        self._layer_cache, self._ranges, self._reading = {}, {}, 0  # (slices are read in order)
        first = DeepSpeedCheckpoint(path, untrained, 0, self._pipeline_module)
        ms = first.model_states
        mp_world = int(ms.get("mp_world_size", 1) or 1)
        dims = ms.get("checkpoint_parallel_dimensions") or {}
        pp = int(dims.get("pp_degree", 1) or 1) if dims else (mp_world if first.pipeline else 1)
        tp = int(dims.get("tp_degree", 1) or 1) if dims else mp_world // pp
        if pp * tp != mp_world:
            raise ValueError(f"load_checkpoint: {path}: the model states say {mp_world} model-parallel slices but "
                             f"pipeline {pp} x tensor {tp}")
        if mps != list(range(mp_world)):
            raise ValueError(f"load_checkpoint: {path} was saved by {mp_world} model-parallel slices, but holds the "
                             f"model states of slices {mps}")
        self.tp, self.pp, self.mp_world = tp, pp, mp_world
        self.slices = [first]
        for m in range(1, mp_world):
            s = DeepSpeedCheckpoint(path, untrained, m, self._pipeline_module)
            self._same_save(first, s)
            self.slices.append(s)
        self.model_states, self.world, self.stage = ms, first.world, first.stage
        # (the slices' steps agree; a pipeline slice holding none of the loading stage's parameters may not say it)
        self.step, self.param_groups, self.scaler = max(s.step for s in self.slices), first.param_groups, first.scaler
        self.names, self._where = [], {}
        for m, s in enumerate(self.slices):
            for n in s.names:
                if n not in self._where:
                    self.names.append(n)
                self._where.setdefault(n, []).append(m)

    # --- pipelines ------------------------------------------------------------------------------
    def _all_layers(self, tp_rank):
        """[(layer index, {name: tensor})] of one tensor-parallel rank, in layer order."""
        if tp_rank not in self._layer_cache:
            out = []
            for idx in sorted(self._layer_files):
                files = self._layer_files[idx]
                f = files.get(tp_rank)
                if f is None and len(files) == 1 and tp_rank in (None, 0):  # (a model axis of size 1, or none)
                    f = next(iter(files.values()))
                if f is None:
                    raise ValueError(f"load_checkpoint: {self.path} has no file of pipeline layer {idx} for "
                                     f"tensor-parallel slice {tp_rank}")
                prefix = self.prefixes.get(idx, f"{idx}.")
                out.append((idx, {prefix + k: v for k, v in load(f).items()}))
            self._layer_cache[tp_rank] = out
        return self._layer_cache[tp_rank]

    def _pipeline_module(self, ms):
        """A pipeline slice's module: the layers holding its parameters (ZeRO's param_shapes name
        them; without ZeRO, the layers after the previous slice's, up to what its optimizer held)."""
        if not self._layer_files:
            raise ValueError(f"load_checkpoint: {self.path}: the model states hold no module and the folder no "
                             "pipeline layer files (layer_XX-model_states.pt)")
        dims = ms.get("checkpoint_parallel_dimensions") or {}
        tp = int(dims.get("tp_degree", 1) or 1)
        mp, self._reading = self._reading, self._reading + 1
        tp_rank, stage = (mp % tp if tp > 1 else None), mp // tp
        layers = self._all_layers(tp_rank)
        buffers = set(ms.get("buffer_names") or [])
        shapes = ms.get("param_shapes")
        if shapes:
            mine = {n for g in shapes for n in g} | buffers
            idx = {i for i, values in layers if any(n in mine for n in values)}
            lo, hi = (min(idx), max(idx)) if idx else (0, -1)
        elif stage in self._ranges:  # (another tensor-parallel rank of a stage already cut)
            lo, hi = self._ranges[stage]
        else:  # stage 0: contiguous layers after the previous stage's, up to what the optimizer held
            opt = ms.get("optimizer") or {}
            if not opt or "single_partition_of_fp32_groups" in opt:
                raise ValueError(f"load_checkpoint: {self.path}: pipeline slice {mp} was saved without ZeRO by " + (
                    "DeepSpeed's BF16_Optimizer (bf16 without ZeRO: partitions in bf16_zero_pp_rank_* files), which "
                    "chorus does not read; DeepSpeed 0.19.8 does not load it back either" if opt else
                    "an engine without an optimizer: nothing to resume"))
            if "fp32_groups_flat" in opt:
                need, count = sum(t.numel() for t in opt["fp32_groups_flat"]), (lambda t: t.numel())
            else:
                need, count = sum(len(g.get("params", [])) for g in opt.get("param_groups") or []), (lambda t: 1)
            start = self._ranges[stage - 1][1] + 1 if stage else layers[0][0] if layers else 0
            got, hi = 0, start - 1
            for i, values in layers:
                if i >= start and got < need:
                    got += sum(count(v) for n, v in values.items() if n not in buffers)
                    hi = i
            if got != need:
                raise ValueError(f"load_checkpoint: {self.path}: the pipeline layers from layer {start} do not hold "
                                 f"the {need} values the optimizer of slice {mp} holds")
            lo = start
        self._ranges[stage] = (lo, hi)
        module = {}
        for i, values in layers:
            if lo <= i <= hi:
                module.update(values)
        tied = {n: v for n, v in module.items() if n.startswith("tied_modules.")}
        return {**tied, **{n: v for n, v in module.items() if n not in tied}}

    @staticmethod
    def _same_save(a, b):
        keys = ("global_steps", "global_samples", "skipped_steps", "dp_world_size", "mp_world_size")
        got, want = tuple(b.model_states.get(k) for k in keys), tuple(a.model_states.get(k) for k in keys)
        if got != want or a.stage != b.stage:
            raise ValueError(f"load_checkpoint: slice {b.mp} of {a.path} is not of the same save as slice 0 "
                             f"({dict(zip(keys, got))}, stage {b.stage} against {dict(zip(keys, want))}, stage {a.stage})")

    # --- values ---------------------------------------------------------------------------------
    def has(self, name):
        return name in self._where

    def _parts(self, name, table):
        """The tensor-parallel slices' tensors of a name, from the slices holding it (a pipeline
        stage's first tensor-parallel group)."""
        slices = self._where[name]
        stage = slices[0] // self.tp
        return [table(self.slices[m]) for m in slices if m // self.tp == stage]

    def value(self, name, shape, tp=1, tp_rank=0, dim=None):
        """(fp32, {state key: tensor}) of parameter `name` for an engine holding `shape` as
        tensor-parallel slice tp_rank of tp (dim: its partition_dim, where known)."""
        fp32 = self._parts(name, lambda s: s.fp32[name])
        states = self._parts(name, lambda s: s.states.get(name, {}))
        keys = set.intersection(*[set(x) for x in states]) if states else set()
        pick = self.cutter(name, [tuple(t.shape) for t in fp32], tuple(shape), tp, tp_rank, dim)
        return pick(fp32), {k: pick([x[k] for x in states]) for k in keys}

    def cutter(self, name, have, shape, tp, tp_rank, dim):
        """How to make the engine's piece from the saved slices."""
        saved = len(have)
        if saved == tp and have[tp_rank] == shape:
            return lambda ts: ts[tp_rank]
        if all(h == shape for h in have):  # held alike by every slice (not sliced)
            return lambda ts: ts[0]
        if dim is None or dim < 0:  # the one dimension whose size differs
            diff = [d for d in range(len(shape)) if have[0][d] != shape[d]] if len(have[0]) == len(shape) else []
            dim = diff[0] if len(diff) == 1 else None
        if dim is None or any(len(h) != len(shape) for h in have) or \
                sum(h[dim] for h in have) != shape[dim] * tp or \
                any(h[:dim] + h[dim + 1:] != shape[:dim] + shape[dim + 1:] for h in have):
            raise ValueError(f"load_checkpoint: '{name}' is saved as {saved} tensor-parallel slices {have[:4]} in "
                             f"{self.path}; they do not cut into this engine's slice {shape} of {tp}")
        size = shape[dim]
        return lambda ts: torch.cat([t.reshape(h) for t, h in zip(ts, have)], dim).narrow(dim, tp_rank * size, size)

    def module_values(self):
        """{name: [tensor per tensor-parallel slice]} of every module entry (16-bit values,
        frozen parameters and buffers), a pipeline's stages together."""
        return self._by_name(lambda s: s.module)

    def frozen(self):
        """{name: [tensor per tensor-parallel slice]} of the parameters not trained (a pipeline layer
        holding only those, at a stage's edge, is in no slice's layers: from the layer files)."""
        out = self._by_name(lambda s: s.frozen())
        if self._layer_files:
            trained, buffers, extra = set(self.names), self.buffer_names(), {}
            for r in [None] if self.tp == 1 else range(self.tp):
                for _, values in self._all_layers(r):
                    for n, v in values.items():
                        if n not in out and n not in trained and n not in buffers and v.numel():
                            extra.setdefault(n, []).append(v)
            out.update(extra)
        return out

    def _by_name(self, table):
        """{name: [tensor per tensor-parallel slice]}, from the first stage holding the name (a tied
        layer is in several)."""
        out, first = {}, {}
        for m, s in enumerate(self.slices):
            for n, v in table(s).items():
                if first.setdefault(n, m // self.tp) == m // self.tp:
                    out.setdefault(n, []).append(v)
        return out

    def buffer_names(self):
        return {n for s in self.slices for n in (s.model_states.get("buffer_names") or [])}

    def client_state(self):
        return self.slices[0].client_state()
