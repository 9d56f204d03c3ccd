"""PipelineEngine: train_batch / eval_batch over a PipelineModule, with DeepSpeed's
1F1B schedule. Each stage's layers are a DeepSpeedEngine over the stage's
data-parallel process set (ZeRO 0-1 there); activations and their gradients move
between neighbouring stages by chorus's point-to-point; tied weights are summed
over the stages that share them; the gradient norm (so clipping and the loss
scaler's overflow) is the whole model's, so every stage steps or skips together."""
import os
import time

import torch

from chorus import _core
import chorus.torch as hvd
from chorus.deepspeed.runtime.engine import DeepSpeedEngine
from chorus.deepspeed.runtime.pipe.schedule import inference_steps, train_steps
from chorus.deepspeed.runtime.pipe.topology import Grid, process_set_for
from chorus.deepspeed.runtime.whole_model import write_state
from chorus.torch.handles import _DTYPES

_TAG_META, _TAG_ACT, _TAG_GRAD = 101, 102, 103
_META_LEN = 64  # int64 words: a count, then per tensor dtype, requires_grad, ndim and up to 8 sizes
_CODES = {code: dtype for dtype, code in _DTYPES.items()}


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


class PipelineEngine:
    def __init__(self, module, optimizer=None, model_parameters=None, config_text=None, lr_scheduler=None):
        import json
        self.module = module
        self.grid = Grid(module.topology())
        topo = module.topology()
        self.num_stages = topo.get_dim("pipe")
        self.stage_id = module.stage_id
        self.global_rank = hvd.rank()
        stage = json.loads(config_text).get("zero_optimization", {}).get("stage", 0)
        if stage > 1:
            raise ValueError(f"pipeline parallelism runs ZeRO stage 0 or 1 within each stage (as DeepSpeed), "
                             f"not stage {stage}")
        coord = self.grid.coord._asdict()
        self._prev = topo.get_rank(**dict(coord, pipe=self.stage_id - 1)) if self.stage_id > 0 else None
        self._next = topo.get_rank(**dict(coord, pipe=self.stage_id + 1)) if self.stage_id < self.num_stages - 1 \
            else None
        # The loss leaves from one rank of the last stage (tensor-parallel slice 0: they agree).
        root = dict(coord, pipe=self.num_stages - 1)
        if "model" in root:
            root["model"] = 0
        self.last_stage_rank = topo.get_rank(**root)
        self.dp_set = self.grid.sets["data"]
        self.pipe_set = self.grid.sets.get("replica") or self.grid.sets.get("pipe")
        self._tied = self._tie_weights()
        tp = topo.get_dim("model")
        norm_set = self.pipe_set if self.num_stages > 1 or tp > 1 else None
        self.engine = DeepSpeedEngine(module, optimizer, model_parameters, config_text, self.dp_set, lr_scheduler,
                                      pipe_set=norm_set, tensor_parallel_size=tp,
                                      model_parallel_rank=coord.get("model", 0),
                                      tensor_parallel_set=self.grid.sets.get("model"))
        index = {id(p): i for i, p in enumerate(self.engine._params)}
        self._tied_index = {}
        for key, ps in self._tied.items():
            for p in module.tied_parameters(key):
                if id(p) in index:
                    self._tied_index[index[id(p)]] = ps
        self.engine._defer = set(self._tied_index)
        self.micro_batches = self.engine.gradient_accumulation_steps()
        self.data_iterator = None
        self.agg_train_loss = None
        self._sends = []
        # Seconds this stage waited for its neighbours in the last train_batch, and
        # that batch's length: the pipeline's bubble as this stage saw it.
        self.wait_seconds = 0.0
        self.batch_seconds = 0.0

    # --- set-up ------------------------------------------------------------------------------
    def _tie_weights(self):
        """Process sets of the stages sharing each tied key (this data index), and the
        first stage's weights copied to the others before training starts."""
        topo = self.module.topology()
        coord = self.grid.coord._asdict()
        sets = {}
        for key, stages in sorted(self.module.tied_keys_everywhere().items()):
            if len(stages) < 2:
                continue
            mine = None
            for other in self._all_coords_but_pipe(topo):  # collective: every group of every replica
                group = [topo.get_rank(**dict(other, pipe=s)) for s in stages]
                ps = process_set_for(group)
                if self.global_rank in group:
                    mine = ps
            if self.stage_id in stages:
                root = topo.get_rank(**dict(coord, pipe=stages[0]))
                for p in self.module.tied_parameters(key):
                    hvd.broadcast_(p.data, root, process_set=mine)
                sets[key] = mine
        return sets

    @staticmethod
    def _all_coords_but_pipe(topo):
        import itertools
        axes = [a for a in topo.get_axis_names() if a != "pipe"]
        for values in itertools.product(*[range(topo.get_dim(a)) for a in axes]):
            yield dict(zip(axes, values))

    # --- queries as DeepSpeed's ----------------------------------------------------------------
    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.num_stages - 1

    def set_dataiterator(self, iterator):
        self.data_iterator = iterator

    def __getattr__(self, name):  # everything else: the stage's DeepSpeedEngine
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    @property
    def global_steps(self):
        return self.engine.global_steps

    # --- activations between stages ------------------------------------------------------------
    def _send_activations(self, out):
        outs = _as_tuple(out)
        tensors = [t.detach().contiguous() for t in outs]
        meta = [len(tensors), 1 if isinstance(out, tuple) else 0]
        for o, t in zip(outs, tensors):
            if t.dim() > 8:
                raise ValueError(f"pipeline: an activation of {t.dim()} dimensions (8 at most)")
            meta += [_DTYPES[t.dtype], int(o.requires_grad), t.dim(), *t.shape]
        if len(meta) > _META_LEN:
            raise ValueError("pipeline: a stage's output has too many tensors to describe")
        header = torch.tensor(meta + [0] * (_META_LEN - len(meta)), dtype=torch.int64)
        self._sends.append(hvd.isend(header, self._next, tag=_TAG_META))
        for t in tensors:
            self._sends.append(hvd.isend(t, self._next, tag=_TAG_ACT))
        return [t for t in _as_tuple(out)]

    def _recv_activations(self):
        start = time.perf_counter()
        try:
            return self._recv_activations_now()
        finally:
            self.wait_seconds += time.perf_counter() - start

    def _recv_activations_now(self):
        header = hvd.recv(torch.empty(_META_LEN, dtype=torch.int64), self._prev, tag=_TAG_META).tolist()
        count, is_tuple, at = header[0], header[1], 2
        works, tensors = [], []
        for _ in range(count):
            code, grad, ndim = header[at:at + 3]
            shape = header[at + 3:at + 3 + ndim]
            at += 3 + ndim
            t = torch.empty(shape, dtype=_CODES[code])
            works.append(hvd.irecv(t, self._prev, tag=_TAG_ACT))
            tensors.append((t, bool(grad)))
        for w in works:
            w.wait()
        out = []
        for t, grad in tensors:
            out.append(t.requires_grad_() if grad and t.is_floating_point() else t)
        return tuple(out) if is_tuple else out[0]

    def _next_batch(self, data_iter):
        if data_iter is None:
            raise ValueError("train_batch/eval_batch: the first and last stages need data_iter "
                             "(or engine.set_dataiterator)")
        return next(data_iter)

    # --- the schedule ------------------------------------------------------------------------
    def _forward(self, i, data_iter, state, grad):
        batch = None
        if self.is_first_stage():
            batch = self._next_batch(data_iter)
            x = self.engine._cast(batch[0])
        else:
            x = self._recv_activations()
        if self.is_last_stage() and not self.is_first_stage():
            batch = self._next_batch(data_iter)
        with torch.set_grad_enabled(grad):
            out = self.module(x)
            if self.is_last_stage():
                label = batch[1] if batch is not None and len(batch) > 1 else None
                loss = self.module.loss_fn(out, label) if self.module.loss_fn is not None and state["compute_loss"] \
                    else out
                state["losses"].append(loss.detach().float() if torch.is_tensor(loss) and loss.numel() == 1 else loss)
                if state.get("logits") is not None:
                    state["logits"].append(out.detach() if torch.is_tensor(out) else out)
                state["out"][i] = loss
            else:
                state["out"][i] = self._send_activations(out)
        if grad:
            state["in"][i] = x

    def _backward(self, i, state):
        out = state["out"].pop(i)
        if self.is_last_stage():
            factor = self.engine.core.loss_scale / self.micro_batches
            (out.float() * factor).backward()
        else:
            pairs = [t for t in out if torch.is_tensor(t) and t.requires_grad]
            grads = [torch.empty(t.shape, dtype=t.dtype) for t in pairs]
            works = [hvd.irecv(g, self._next, tag=_TAG_GRAD) for g in grads]
            start = time.perf_counter()
            for w in works:
                w.wait()
            self.wait_seconds += time.perf_counter() - start
            torch.autograd.backward(pairs, grads)
        x = state["in"].pop(i)
        if not self.is_first_stage():
            for t in _as_tuple(x):
                if torch.is_tensor(t) and t.requires_grad:
                    g = t.grad if t.grad is not None else torch.zeros_like(t)
                    self._sends.append(hvd.isend(g.contiguous(), self._prev, tag=_TAG_GRAD))

    def _finish_sends(self):
        for w in self._sends:
            w.wait()
        self._sends = []

    def _aggregate(self, losses):
        """The mean loss of the batch on every rank: averaged over the micro-batches and
        the data-parallel replicas on the last stage, then sent to the other stages."""
        value = torch.zeros(1, dtype=torch.float32)
        if self.is_last_stage():
            value[0] = float(torch.stack([l.reshape(()) for l in losses]).mean()) if losses else 0.0
            if self.dp_set is not None and self.dp_set.size() > 1:
                value = hvd.allreduce(value, op=hvd.Average, process_set=self.dp_set, name="pipe.loss")
        if self.num_stages > 1:
            value = hvd.broadcast(value, self.last_stage_rank, process_set=self.pipe_set, name="pipe.loss.bcast")
        return value[0]

    def train_batch(self, data_iter=None):
        """One optimizer step over gradient_accumulation_steps micro-batches (1F1B);
        returns the batch's mean loss on every rank."""
        data_iter = data_iter if data_iter is not None else self.data_iterator
        self.module.train()
        state = {"in": {}, "out": {}, "losses": [], "compute_loss": True}
        self.wait_seconds, started = 0.0, time.perf_counter()
        try:
            for kind, i in train_steps(self.micro_batches, self.num_stages, self.stage_id):
                if kind == "forward":
                    self._forward(i, data_iter, state, grad=True)
                else:
                    self._backward(i, state)
            self._finish_sends()
        except BaseException:
            self._sends = []
            raise
        self.batch_seconds = time.perf_counter() - started
        # Tied weights: each stage's gradient, summed over the stages that share it.
        self.engine._flush_deferred(lambda i, g: hvd.allreduce_(g, op=hvd.Sum, process_set=self._tied_index[i],
                                                                 name=f"pipe.tied.{i}"))
        for _ in range(self.micro_batches):
            self.engine.step()
        self.agg_train_loss = self._aggregate(state["losses"])
        self.engine.monitor.write_events([("Train/Samples/train_loss", self.agg_train_loss.mean().item(),
                                           self.engine.global_samples)])
        return self.agg_train_loss

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg"):
        """Forward passes over the micro-batches; returns the mean loss on every rank
        (and, with return_logits, the last stage's outputs there)."""
        self.module.eval()
        state = {"in": {}, "out": {}, "losses": [], "compute_loss": compute_loss,
                 "logits": [] if return_logits else None}
        with torch.no_grad():
            for _, i in inference_steps(self.micro_batches):
                self._forward(i, data_iter, state, grad=False)
                state["out"].pop(i, None)
            self._finish_sends()
        losses = [l for l in state["losses"] if torch.is_tensor(l) and l.numel() == 1]
        loss = self._aggregate(losses) if reduce_output == "avg" else state["losses"]
        if reduce_output == "avg" and torch.is_tensor(loss):
            self.engine.monitor.write_events([("Train/Samples/eval_loss", loss.mean().item(),
                                               self.engine.global_samples)])
        if return_logits:
            return loss, state["logits"] if self.is_last_stage() else None
        return loss

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """The whole model's weights (every stage's layers, tensor-parallel slices joined)
        in their training dtype, written by the first rank; every rank calls it."""
        state = self.engine.whole_16bit_state(exclude_frozen_parameters)
        stages = self.grid.sets.get("pipe")
        if stages is not None:  # layers are named by their global index: the stages' states add up
            parts = hvd.allgather_object({k: v.cpu() for k, v in state.items()}, name="save16.stages",
                                         process_set=stages)
            state = {k: v for part in parts for k, v in part.items()}
        if self.global_rank == 0:
            write_state(state, save_dir, save_filename)
        hvd.barrier()
        return True

    save_fp16_model = save_16bit_model

    # --- checkpoints: one folder per stage -----------------------------------------------------
    def _stage_dir(self, root):
        return os.path.join(root, f"pipe_stage_{self.stage_id:02d}")

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, async_save=None):
        from chorus.deepspeed.runtime.zero import checkpoint_io
        if checkpoint_io.async_requested(self.engine, async_save):
            raise ValueError("save_checkpoint: a pipeline engine saves synchronously (each stage's folder, then "
                             "`latest`); asynchronous saves are the data-parallel engine's so far")
        tag = str(tag) if tag is not None else f"global_step{self.engine.global_steps}"
        from chorus.deepspeed.runtime.zero.checkpoint import checkpoint_format
        # DeepSpeed's layout: every stage's files in one folder (mp_rank_XX, layer_XX); chorus's: one per stage
        where = save_dir if checkpoint_format(self.engine) == "deepspeed" else self._stage_dir(save_dir)
        self.engine.save_checkpoint(where, tag, client_state, save_latest=False, async_save=False)
        hvd.barrier()
        if save_latest and self.global_rank == 0:
            _core.write_file_atomic(os.path.join(save_dir, "latest"), tag.encode())
        hvd.barrier()
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        from chorus.deepspeed.runtime.zero.checkpoint import resolve_tag
        if (self.engine._raw_config.get("checkpoint") or {}).get("load_universal"):  # (every stage's in one folder)
            return self.engine.load_checkpoint(load_dir, tag, load_lr_scheduler_states=load_lr_scheduler_states)
        tag = resolve_tag(load_dir, tag)
        if tag is None:
            import warnings
            warnings.warn(f"load_checkpoint: no 'latest' file in {load_dir}; nothing loaded")
            return None, None
        from chorus.deepspeed.checkpoint.deepspeed_format import is_deepspeed_checkpoint
        from chorus.deepspeed.checkpoint.universal import is_universal_checkpoint
        path = os.path.join(load_dir, tag)  # DeepSpeed's pipeline layout or a universal one: any stage count
        if is_deepspeed_checkpoint(path) or is_universal_checkpoint(path):
            return self.engine.load_checkpoint(load_dir, tag, load_lr_scheduler_states=load_lr_scheduler_states)
        stage_dir = self._stage_dir(load_dir)
        if not os.path.isdir(os.path.join(stage_dir, tag)):
            raise ValueError(f"load_checkpoint: {load_dir} has no checkpoint '{tag}' for pipeline stage "
                             f"{self.stage_id} (was it saved with {self.num_stages} stages?)")
        return self.engine.load_checkpoint(stage_dir, tag, load_lr_scheduler_states=load_lr_scheduler_states)
