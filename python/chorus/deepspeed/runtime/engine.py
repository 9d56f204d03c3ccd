"""DeepSpeedEngine: wraps a torch module and hooks it into chorus's C++ ZeRO engine
(partitioning, collectives, loss scaling, clipping and the optimizer all run there)."""
import json
import os
import warnings

import torch

from chorus import _core
import chorus.torch as hvd
from chorus.deepspeed.runtime import config as ds_config
from chorus.deepspeed.runtime.zero import checkpoint, checkpoint_io, stage3
from chorus.deepspeed.runtime.zero import linear as zero_linear
from chorus.deepspeed.runtime.views import view as _view
from chorus.deepspeed.runtime.engine_monitor import EngineMonitor
from chorus.deepspeed.runtime.engine_queries import EngineQueries
from chorus.deepspeed.runtime.engine_random_ltd import EngineRandomLTD
from chorus.deepspeed.runtime.engine_curriculum import EngineCurriculum
from chorus.deepspeed.runtime.base_optimizer import ZeroOptimizer
from chorus.deepspeed.runtime.optimizers import translate
from chorus.deepspeed.runtime import expert_parts, lr_schedules, whole_model
from chorus.deepspeed.runtime import muon, zenflow
from chorus.deepspeed.runtime.torch_autocast import comm_round
from chorus.deepspeed.runtime.utils import is_model_parallel_parameter
from chorus.deepspeed.runtime.whole_model import write_state
from chorus.deepspeed.runtime.zero import partition_parameters
from chorus.torch.handles import _dtype_code

_ZERO_FORMULA = {0: lambda n: (16, 0), 1: lambda n: (4, 12 / n), 2: lambda n: (2, 14 / n), 3: lambda n: (0, 16 / n)}


def _held_names(model, model_parameters):
    """The names of the parameters DeepSpeed's own optimizer would hold, in order: what
    initialize was given, by default every module parameter (frozen ones too)."""
    named = {}
    for n, p in model.named_parameters():
        named.setdefault(id(p), n)
    if model_parameters is None:
        return list(named.values())
    out = []
    for item in model_parameters:
        for p in (item.get("params", []) if isinstance(item, dict) else [item]):
            if id(p) in named and named[id(p)] not in out:
                out.append(named[id(p)])
    return out


def _choose_device(model):
    """Where the engine keeps the model, as DeepSpeed's accelerator does: the GPU
    the model is on, else this rank's GPU (LOCAL_RANK) when CUDA is usable and
    DS_ACCELERATOR does not say cpu, else host memory."""
    where = {p.device for p in model.parameters() if p.device.type != "meta"}
    if len(where) > 1:
        raise ValueError(f"deepspeed.initialize: the model's parameters are on several devices ({sorted(map(str, where))})")
    if where and next(iter(where)).type not in ("cpu", "cuda"):
        raise ValueError(f"deepspeed.initialize: chorus's ZeRO engine runs on the CPU or CUDA, not {next(iter(where))}")
    if where and next(iter(where)).type == "cuda":
        d = next(iter(where))
        return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    if os.environ.get("DS_ACCELERATOR", "").lower() == "cpu" or not torch.cuda.is_available() or \
            not _core.cuda_built():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    local = int(local) if local is not None else hvd.local_rank()
    return torch.device("cuda", local % torch.cuda.device_count())


def _full_shape(p):
    """A parameter's shape, also when zero.Init left only a placeholder."""
    return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)


class DeepSpeedEngine(EngineQueries, EngineMonitor, EngineRandomLTD, EngineCurriculum, torch.nn.Module):
    def __init__(self, model, optimizer=None, model_parameters=None, config_text=None, process_set=None,
                 lr_scheduler=None, pipe_set=None, tensor_parallel_size=1, model_parallel_rank=0,
                 tensor_parallel_set=None):
        super().__init__()
        # This rank's tensor-parallel slice: its checkpoint files are its own (mp_rank_XX);
        # save_16bit_model joins the slices over the tensor-parallel set.
        self._mp_rank = model_parallel_rank if tensor_parallel_size > 1 else None
        self._tp_set = tensor_parallel_set if tensor_parallel_size > 1 else None
        # The ranks holding the model's other pieces (pipeline stages, tensor-parallel
        # slices): the gradient norm is the whole model's. A parameter that the
        # tensor-parallel ranks hold alike counts once (model_parallel marks the sliced ones).
        self._pipe_set = pipe_set
        self._tp = tensor_parallel_size
        self._defer = set()  # parameters whose gradients wait for _flush_deferred (tied across stages)
        self._deferred = {}
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"deepspeed.initialize: model must be a torch.nn.Module, not {type(model).__name__}")
        self.module = model
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        if not self.process_set.included():
            raise ValueError(f"deepspeed.initialize: this rank is not in the process set {self.process_set.ranks}")
        self._config_text = config_text
        # Sequence parallelism (deepspeed.utils.groups' sets): the engine runs over every
        # sequence- and data-parallel rank, and as DeepSpeed's, sums the gradients over
        # the sequence-parallel ranks and averages them over the data-parallel ones; the
        # batch counts data-parallel ranks only.
        from chorus.deepspeed.utils import groups as ds_groups
        self._sp = ds_groups._get_sequence_parallel_world_size() \
            if self.process_set.size() == hvd.size() and pipe_set is None else 1
        self._raw_config = json.loads(config_text)
        if self._sp > 1:  # DeepSpeed's engine reduces in seq_parallel_communication_data_type then
            self._raw_config["communication_data_type"] = ds_config.seq_parallel_comm_dtype(self._raw_config)
            self._config_text = config_text = json.dumps(self._raw_config)
        cfg = ds_config.parse(config_text, self._dp_size())
        self._cfg = cfg
        zf = (self._raw_config.get("zero_optimization") or {}).get("zenflow")
        self._zf_settings = zenflow.Settings(zf, self._raw_config) if zf is not None else None
        if self._zf_settings is not None:  # (DeepSpeed's engine then counts micro-steps in update intervals)
            cfg["gradient_accumulation_steps"] = self._zf_settings.update_interval
        self._zenflow = None
        self._boundary_override = None
        self._step_applied = False
        self._client_optimizer = optimizer
        self.client_lr_scheduler = lr_scheduler
        self.training_dataloader = None
        self.dtype = torch.float16 if cfg["fp16"] else torch.bfloat16 if cfg["bf16"] else torch.float32
        self._device = _choose_device(model)
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
            model.to(self._device)
        if self.dtype != torch.float32:
            model.to(self.dtype)
        self._autocast = None
        if (self._raw_config.get("torch_autocast") or {}).get("enabled"):
            from chorus.deepspeed.runtime.torch_autocast import Autocast
            self._autocast = Autocast(self._raw_config["torch_autocast"], self._device, cfg["stage"])
            self._autocast.mark(model)
        if cfg["stage"] < 3 and cfg["offload_param"] in ("cpu", "nvme"):
            warnings.warn(f"chorus: offload_param is used by ZeRO stage 3 only; ignored at stage {cfg['stage']}")

        if model_parameters is not None:
            model_parameters = list(model_parameters)  # (a generator is read more than once)
        self._given_param_names = _held_names(model, model_parameters)
        (self._params, self._names), experts = expert_parts.split(*self._trainable(model, optimizer,
                                                                                     model_parameters))
        self._shapes = [_full_shape(p) for p in self._params]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        offload = cfg["offload_optimizer"] in ("cpu", "nvme")
        if optimizer is None and str((self._raw_config.get("optimizer") or {}).get("type", "")).lower() == "muon":
            muon.mark(model)
            if ((self._raw_config.get("optimizer") or {}).get("params") or {}).get("per_head_muon"):
                from chorus.deepspeed.runtime import muon_heads
                muon_heads.tag(model, _full_shape)
        kind, groups, self._client = translate(optimizer, self._raw_config.get("optimizer"), offload,
                                               model_parameters if model_parameters is not None else self._params)
        # No optimizer at all: DeepSpeed builds the engine (forward, backward); step() says why it cannot.
        self._has_optimizer = groups is not None
        if groups is None:
            kind, groups = "sgd", [{"lr": 0.0}]
        if kind == "muon":
            params = (self._raw_config.get("optimizer") or {}).get("params") or {}
            self._client = muon.PartitionMuon(groups, self._shapes, self.dtype, params.get("adam_w_mode", True))
            kind = "adamw"  # (the engine's two state buffers hold the auxiliary AdamW's moments)
        else:
            kind, self._client = self._device_kernel(kind, groups, offload)
        if self._zf_settings is not None:
            self._zenflow_client(kind, groups, experts)
        if cfg["offload_optimizer"] == "nvme" and self._client is not None:
            raise ValueError(
                "DeepSpeed config: 'zero_optimization.offload_optimizer.device' nvme keeps the optimizer's state in "
                "files that chorus's own optimizers (Adam, AdamW, SGD, Lion, Adagrad, LAMB, from the config's "
                f"'optimizer' section) step a tile at a time; {type(self._client).__name__} is stepped in Python "
                "over the whole state in memory: name the optimizer in the config, or use offload device \"cpu\"")
        self._core_args = (self._group_of(groups), kind or "adam")
        self.optimizer_groups = groups
        self.core = self._make_core()
        self._attach_params()
        # MoE: each expert group's parameters in an engine over its expert-data-parallel set.
        self._expert_parts = expert_parts.make_parts(self, experts) if experts else []
        for part in self._expert_parts:
            part.attach(_view, self.dtype)
        from chorus.deepspeed.moe.layer import MoE
        self.moe_layers = [m for m in model.modules() if isinstance(m, MoE)]  # DeepSpeed's engine attributes
        self.has_moe_layers = bool(self.moe_layers)
        self.num_experts = [m.num_experts for m in self.moe_layers]
        self.gate_modules = [m.deepspeed_moe.gate for m in self.moe_layers]
        self.optimizer = ZeroOptimizer(self, groups)
        if self._client is not None:
            self._bind_client()
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is None and cfg["scheduler"] is not None:
            self.lr_scheduler = lr_schedules.from_config(self.optimizer, self._raw_config["scheduler"])
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._grad_norm = None
        self._hook_grads()
        self._stage3 = stage3.Stage3Hooks(self) if self.core.stage == 3 else None
        if self._stage3 is not None and (self._raw_config.get("zero_optimization") or {}).get(
                "memory_efficient_linear", True):
            zero_linear.enable()
        self._monitor_init()
        self._random_ltd_init()

    # --- setup -------------------------------------------------------------------------------
    def _zenflow_client(self, kind, groups, experts):
        if kind not in ("adam", "adamw") or self._client is not None:
            raise ValueError("DeepSpeed config: 'zero_optimization.zenflow' steps with DeepSpeed's CPU AdamW: "
                             "the optimizer must be Adam or AdamW")
        if experts or self._pipe_set is not None or self._tp > 1 or self._sp > 1:
            raise ValueError("DeepSpeed config: 'zero_optimization.zenflow' runs over data parallelism only in "
                             "chorus (no MoE, pipeline, tensor or sequence parallelism)")
        self._zenflow = zenflow.ZenFlow(self, self._zf_settings, groups)
        self._client = zenflow.ZenFlowCPUAdam(groups, self._zenflow, kind == "adamw")

    def _torch_ops_for(self, kind, offload):
        """Whether kind steps in torch ops over the partition: on a device, where chorus's
        engine has Adam and SGD kernels only, for Lion and Adagrad (unless offloaded to
        the CPU kernels) and LAMB."""
        return self._device.type == "cuda" and kind in ("lion", "adagrad", "lamb") and \
            not (offload and kind != "lamb")

    def _device_kernel(self, kind, groups, offload):
        """(kind, client): the client that steps kind in torch ops where _torch_ops_for says so
        (the engine keeps kind: its state buffers hold the moments)."""
        if not self._torch_ops_for(kind, offload):
            return kind, self._client
        import inspect
        from chorus.deepspeed.runtime.partition_optimizers import CLASSES
        cls = CLASSES[kind]
        names = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "params")]
        # One stand-in parameter per group; bind() points the optimizer at the partition.
        return kind, cls([dict({k: g[k] for k in names if k in g}, params=[torch.zeros(1)]) for g in groups],
                         **{k: groups[0][k] for k in names if k in groups[0]})

    def _make_core(self):
        if self._cfg["offload_optimizer"] != "nvme":
            return self._new_core()
        # A swap folder one rank cannot use (full, not a folder) fails there: every rank raises, none waits.
        core, error = None, None
        try:
            core = self._new_core()
        except ValueError:
            raise  # (the config's: the same on every rank)
        except Exception as e:  # noqa: BLE001 - chorus's error from the swap file
            error = e
        checkpoint._agree(self.process_set, error, "offload to nvme", verb="initialize")
        tile = int((self._raw_config.get("zero_optimization") or {}).get("sub_group_size", 1_000_000_000))
        if core.partition_elems > 1_000_000 and tile >= core.partition_elems:
            warnings.warn(f"chorus: zero_optimization.sub_group_size {tile} is not below this rank's partition "
                          f"({core.partition_elems} elements): offload_optimizer nvme then steps the whole state "
                          "in memory at once; set it lower (1e7, say), as DeepSpeed advises for NVMe")
        return core

    def _new_core(self):
        group_of, kind = self._core_args
        text = self._config_text if self._sp == 1 else ds_config.per_rank(self._raw_config, self._cfg)
        return _core.ZeroEngine(text, self.process_set.process_set_id,
                                _dtype_code(self._params[0], "ZeRO"),
                                [int(torch.Size(s).numel()) for s in self._shapes], group_of, kind,
                                self._pipe_set.process_set_id if self._pipe_set is not None else -1,
                                [1.0 if is_model_parallel_parameter(p) else 1.0 / self._tp for p in self._params]
                                if self._pipe_set is not None and self._tp > 1 else [],
                                [int(getattr(p, "chorus_priority", 0)) for p in self._params],
                                *self._core_device(), grad_factor=float(self._sp))

    def _dp_size(self):
        """The data-parallel size the batch is counted over (every rank of the set but the sequence-parallel ones)."""
        if self.process_set.size() % self._sp:
            raise ValueError(f"deepspeed.initialize: sequence-parallel size {self._sp} does not divide the "
                             f"data-parallel set's {self.process_set.size()} ranks")
        return self.process_set.size() // self._sp

    def _core_device(self):
        """(device ordinal, stream) of a CUDA engine: its work follows the current stream; (-1, 0) on the host."""
        if self._device.type != "cuda":
            return -1, 0
        return self._device.index, torch.cuda.current_stream(self._device).cuda_stream

    def _rebuild(self):
        """Re-forms the engine over the world after an elastic reset: a C++ ZeRO engine
        partitioned for the process set's new size, under the same parameters,
        optimizer object, scheduler and gradient hooks. The values are the old
        engine's parameters; an elastic state loads its last commit next."""
        if self._expert_parts:
            raise RuntimeError("chorus: an elastic reset cannot re-form MoE layers' expert-parallel sets; "
                               "restart the job from a checkpoint at the new size")
        if self._zenflow is not None:
            self._client.settle()
        self._cfg = ds_config.parse(self._config_text, self._dp_size())
        if self._zf_settings is not None:
            self._cfg["gradient_accumulation_steps"] = self._zf_settings.update_interval
        if self._stage3 is not None:
            self._stage3.detach()
            for i, p in enumerate(self._params):  # the full parameters, from the old engine's partition
                p.data = torch.zeros(self._shapes[i], dtype=self.dtype, device=self._device)
        else:
            for p in self._params:
                p.data = p.data.clone()  # off the old engine's storage, which goes now
        self.core = self._make_core()
        self._attach_params()
        if self._client is not None:
            self._bind_client()
        self._stage3 = stage3.Stage3Hooks(self) if self.core.stage == 3 else None
    @staticmethod
    def _trainable(model, optimizer, model_parameters):
        named = {}
        for n, p in model.named_parameters():
            if p.requires_grad and id(p) not in named:
                named[id(p)] = (n, p)
        chosen = None
        if optimizer is not None:
            chosen = [p for g in optimizer.param_groups for p in g["params"]]
        elif model_parameters is not None:
            chosen = []
            for item in model_parameters:
                chosen.extend(item["params"] if isinstance(item, dict) else [item])
        if chosen is not None:
            keep = {id(p) for p in chosen}
            unknown = [p for p in chosen if id(p) not in named]
            if unknown:
                raise ValueError("deepspeed.initialize: the optimizer holds parameters that are not trainable "
                                 "parameters of the model")
            named = {k: v for k, v in named.items() if k in keep}
        if not named:
            raise ValueError("deepspeed.initialize: the model has no trainable parameters")
        params = [p for _, p in named.values()]
        return params, [n for n, _ in named.values()]

    def _group_of(self, groups, params=None):
        """The optimizer group of each of params (default: the main engine's)."""
        where = {}
        for gi, g in enumerate(groups):
            for p in g.get("params", []):
                where[id(p)] = gi
        return [where.get(id(p), 0) for p in (self._params if params is None else params)]

    def _attach_params(self):
        core = self.core
        for i, p in enumerate(self._params):
            zero_init = hasattr(p, "ds_id") and partition_parameters._engine_of(p) is None
            if zero_init:  # built under zero.Init: whole for a moment, one parameter at a time
                partition_parameters._gather_one(p)
                p.data = p.data.to(self.dtype)
            p.data = p.data.contiguous()
            core.load_param(i, p.data_ptr())
            if zero_init and core.stage == 3:
                p.data = torch.empty(0, dtype=self.dtype, device=self._device)
                # (the engine holds the slice now: one parameter whole at a time, never the model)
                for attr in ("ds_tensor", "ds_staged", "ds_staging"):
                    if hasattr(p, attr):
                        delattr(p, attr)
        core.finish_init()
        for i, p in enumerate(self._params):
            if core.stage < 3:
                p.data = _view(core.param_storage(i), self.dtype, self._shapes[i])
                for attr in ("ds_id", "ds_shape", "ds_numel", "ds_tensor", "ds_status", "ds_process_set",
                             "ds_staged", "ds_staging"):
                    if hasattr(p, attr):
                        delattr(p, attr)  # whole on every rank: no longer a ZeRO-3 parameter
            else:
                self._mark_zero3(i, p)

    def _mark_zero3(self, i, p):
        """What DeepSpeed's ZeRO-3 parameters carry, the engine behind them."""
        import weakref
        if not hasattr(p, "ds_id"):
            p.ds_id = partition_parameters._new_id()
        p.ds_shape = torch.Size(self._shapes[i])
        p.ds_numel = int(p.ds_shape.numel())
        p.ds_process_set = self.process_set
        p.ds_status = partition_parameters.ZeroParamStatus.NOT_AVAILABLE
        p._chorus_engine_ref = weakref.ref(self)
        if hasattr(p, "ds_tensor"):
            del p.ds_tensor  # the engine holds the slice now

    # --- ZeRO-3 parameters for GatheredParameters ---------------------------------------------
    def _zero_gather(self, p):
        i = self._index[id(p)]
        self.core.gather_async([i])
        whole = _view(self.core.gathered(i), self.dtype, self._shapes[i]).clone()
        if not self.core.persistent(i):
            self.core.release(i)
        return whole

    def _zero_assign(self, p):
        i = self._index[id(p)]
        value = p.data.to(self.dtype).contiguous()
        self.core.assign_param(i, value.data_ptr())

    def _zero_release(self, p):
        self._stage3._point(self._index[id(p)], p)

    def _bind_client(self):
        """An optimizer chorus cannot translate steps fp32 views of the partition: a
        fresh instance of its class, with its hyperparameters, over those views."""
        from chorus.deepspeed.runtime.partition_optimizers import _PartitionOptimizer
        if isinstance(self._client, _PartitionOptimizer):
            self._client.bind(self)
            self.optimizer.param_groups = self._client.param_groups
            return
        per_group = {}
        for core in [self.core] + [part.core for part in self._expert_parts]:
            master = _view(core.master_view(), torch.float32)
            grads = _view(core.external_grad_view(), torch.float32)
            for offset, length, group in core.runs():
                t = master[offset:offset + length]
                t.grad = grads[offset:offset + length]
                per_group.setdefault(group, []).append(t)
        groups = [dict(g, params=per_group.get(gi, [])) for gi, g in enumerate(self._client.param_groups)]
        groups = [g for g in groups if g["params"]]
        self._client = type(self._client)(groups, **self._client.defaults)
        self.optimizer.param_groups = self._client.param_groups

    def _hook_grads(self):
        self._accumulators = []
        for i, p in enumerate(self._params):
            # The accumulator keeps the shape p has now: a ZeRO-3 placeholder must show its whole one.
            held = p.data
            if tuple(p.shape) != self._shapes[i]:
                p.data = torch.empty(self._shapes[i], dtype=p.dtype, device=p.device)
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            p.data = held
            acc.register_hook(self._make_hook(i, p))
            self._accumulators.append(acc)
        for part in self._expert_parts:
            for i, p in enumerate(part.params):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_expert_hook(part.core, i, p))
                self._accumulators.append(acc)

    @staticmethod
    def _make_expert_hook(core, i, p):
        def hook(*_):
            g = p.grad
            if g is None:
                return
            g = g.to_dense() if g.is_sparse else g
            g = comm_round(p, g).contiguous()
            core.grad_ready(i, g.data_ptr())
            p.grad = None
        return hook

    def _make_hook(self, i, p):
        def hook(*_):
            g = p.grad
            if g is None:
                return
            if g.is_sparse:
                g = g.to_dense()
            g = comm_round(p, g)
            if self._zenflow is not None:
                self._zenflow.grab(i, g)
            if i in self._defer:  # summed over micro-batches here, handed over by _flush_deferred
                acc = self._deferred.get(i)
                self._deferred[i] = g.detach().clone() if acc is None else acc.add_(g)
                p.grad = None
                return
            g = g.contiguous()
            self.core.grad_ready(i, g.data_ptr())
            p.grad = None
            if self._stage3 is not None:
                self._stage3.grad_done(i)
        return hook

    def _flush_deferred(self, reduce):
        """Hands the deferred gradients to the engine after reduce(index, grad) (in
        place) combined them; zeros for a deferred parameter that got none."""
        for i in sorted(self._defer):
            g = self._deferred.pop(i, None)
            if g is None:
                g = torch.zeros(self._shapes[i], dtype=self.dtype, device=self._device)
            g = g.contiguous()
            reduce(i, g)
            self.core.grad_ready(i, g.data_ptr())

    # --- training ----------------------------------------------------------------------------
    def _cast(self, x):
        if torch.is_tensor(x):
            return x.to(self.dtype) if x.is_floating_point() and x.dtype != self.dtype else x
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(v) for v in x)
        if isinstance(x, dict):
            return {k: self._cast(v) for k, v in x.items()}
        return x

    def forward(self, *inputs, **kwargs):
        if self.dtype != torch.float32:
            inputs, kwargs = self._cast(inputs), self._cast(kwargs)
        self._random_ltd_forward()
        with self._timed("forward"), self._profiled_forward():
            if self._autocast is not None:
                with self._autocast.context():
                    return self.module(*inputs, **kwargs)
            return self.module(*inputs, **kwargs)

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """scale_wrt_gas=False: the caller divided the loss by the accumulation steps already."""
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError("model_engine.backward expects the scalar loss tensor")
        factor = self.core.loss_scale / (self.gradient_accumulation_steps() if scale_wrt_gas else 1)
        scaled = loss.float() * factor if factor != 1.0 else loss
        if self._zenflow is not None:
            self._zenflow.backward_prologue()
        with self._timed("backward", "backward_inner"):
            scaled.backward(retain_graph=retain_graph)
        with self._timed("backward", "backward_allreduce"):
            self.core.end_backward()
            for part in self._expert_parts:
                part.core.end_backward()
            if self._stage3 is not None:
                self._stage3.end_backward()
            if self._zenflow is not None:
                self._zenflow.after_backward(self.is_gradient_accumulation_boundary())
        if self._model_info is not None:
            self._model_info_exit()
        return loss

    def step(self, lr_kwargs=None):
        if not self._has_optimizer:
            raise RuntimeError("model_engine.step(): this engine has no optimizer (none was passed to "
                               "deepspeed.initialize and the config has no 'optimizer' section); it runs "
                               "forward and backward only")
        boundary = self.is_gradient_accumulation_boundary()
        profiling = self._profiling()
        if self._zenflow is not None:
            self._zenflow.sync_lr()
        self.micro_steps += 1
        self.global_samples += self.train_micro_batch_size_per_gpu() * self._dp_size()
        if boundary:
            with self._timed("step"):
                self._boundary_step(lr_kwargs)
        if self._zenflow is not None:
            self._zenflow.after_step(boundary)
            if not boundary and self.lr_scheduler is not None:  # (ZenFlow's engine steps it every micro-step)
                self.lr_scheduler.step(**(lr_kwargs or {}))
        self._after_step(boundary, profiling)
        if boundary and getattr(self, "_pending_save", None) is not None:
            checkpoint_io.poll(self, block=False)  # an asynchronous save's `latest`, once all ranks wrote

    def _boundary_step(self, lr_kwargs):
        if self._expert_parts:
            skipped, norm = self._step_with_experts()
        elif self._client is None:
            skipped, norm, _ = self.core.step(self.optimizer.hypers())
        else:
            before_norm = getattr(self._client, "before_norm", None)
            if before_norm is not None:  # (Muon: the norm and the clip are over what it makes of the gradients)
                self.core.prepare_external()
                self._agreed(before_norm)
                skipped, norm, _ = self.core.finish_external()
            else:
                skipped, norm, _ = self.core.step_external()
            if not skipped:
                self._client.step()
                self.core.publish_external()
        self.global_steps += 1
        self._step_applied = not skipped
        if skipped:
            self.skipped_steps += 1
        else:
            self._grad_norm = norm
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))

    def _agreed(self, work):
        """work() on every rank; one rank's failure is raised on all of them, not a hang in the next collective."""
        error = None
        try:
            work()
        except Exception as e:  # noqa: BLE001
            error = e
        failed = hvd.allreduce(torch.tensor([0 if error is None else 1]), op=hvd.Sum, name="chorus.before_norm",
                               process_set=self.process_set)
        if error is not None:
            raise error
        if int(failed.item()):
            raise RuntimeError("model_engine.step(): another rank failed in the optimizer's update")

    def _step_with_experts(self):
        """Every engine of the model steps with the model's norm (so all skip or clip alike)."""
        cores = [self.core] + [part.core for part in self._expert_parts]
        muon_like = self._client is not None and getattr(self._client, "before_norm", None) is not None
        total = None if muon_like else expert_parts.total_sum_squares(self)
        if self._client is None:
            hypers = self.optimizer.hypers()
            results = [core.step(hypers, total) for core in cores]
        elif muon_like:  # (Muon: the norm of its updates)
            for core in cores:
                core.prepare_external()
            self._agreed(self._client.before_norm)
            total = self.core.external_set_sum_squares() + sum(part.sum_squares(external=True)
                                                               for part in self._expert_parts)
            results = [core.finish_external(total) for core in cores]
            if not results[0][0]:
                self._client.step()
                for core in cores:
                    core.publish_external()
        else:
            results = [core.step_external(total) for core in cores]
            if not results[0][0]:
                self._client.step()
                for core in cores:
                    core.publish_external()
        return results[0][0], results[0][1]

    def zero_grad(self):
        """Gradients live in the engine and are cleared at each step."""

    @property
    def is_compiled(self):
        return getattr(self, "_is_compiled", False)

    def compile(self, backend=None, compile_kwargs=None, schedule=None, compiled_autograd_enabled=False):
        """torch.compile of the module in place (its parameters stay the engine's), as
        DeepSpeed's engine.compile without DeepCompile."""
        if not hasattr(torch.nn.Module, "compile"):
            raise RuntimeError(f"compile is not supported in your version of PyTorch ({torch.__version__}; "
                               "nn.Module.compile needs 2.2 or later)")
        if schedule is not None:
            raise ValueError("engine.compile(schedule=...): schedules are DeepCompile's, which chorus does not have")
        if compiled_autograd_enabled:
            raise ValueError("engine.compile(compiled_autograd_enabled=True): chorus's gradient hooks hand each "
                             "gradient to its ZeRO engine as autograd makes it, which compiled autograd would trace")
        if self.is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        kwargs["backend"] = backend or kwargs.get("backend", "inductor")
        self.module.compile(**kwargs)
        self._is_compiled = True
        self._compile_kwargs = kwargs

    @property
    def loss_scale(self):
        return self.core.loss_scale

    @property
    def device(self):
        return self._device

    def to(self, *args, **kwargs):
        """The model stays where the engine keeps it (its tensors are views of the
        engine's memory): a move there is a no-op, elsewhere an error."""
        device = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device, int)) else None)
        if device is not None:
            want = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            if want.type == "cuda" and want.index is None and torch.cuda.is_available():
                want = torch.device("cuda", torch.cuda.current_device())
            if want.type != self._device.type or (want.index is not None and want.index != self._device.index):
                where = "host memory" if self._device.type == "cpu" else str(self._device)
                raise ValueError(f"chorus's ZeRO engine keeps the model in {where}; it cannot move to {want}")
        return self

    def cuda(self, device=None):
        return self.to(torch.device("cuda", device) if isinstance(device, int) else device or "cuda")

    def cpu(self):
        return self.to("cpu")

    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True):
        replicas, index = self.process_set.size(), self.process_set.rank()
        if self._sp > 1:  # a sequence-parallel set's ranks read the same samples (each its slice of them)
            from chorus.deepspeed.utils import groups as ds_groups
            replicas, index = self._dp_size(), ds_groups._get_data_parallel_rank()
        if self.curriculum_learning_enabled():
            return self._curriculum_io(dataset, batch_size, collate_fn, replicas, index)
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=replicas, rank=index,
                                                                  shuffle=shuffle)
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                                           sampler=sampler, collate_fn=collate_fn,
                                           drop_last=bool(self._raw_config.get("dataloader_drop_last", False)))

    # --- memory and checkpoints --------------------------------------------------------------
    def memory_report(self):
        """This rank's bytes of model states, beside the ZeRO paper's figure for mixed-precision Adam."""
        m = dict(self.core.memory())
        n = self.process_set.size()
        fixed, per = _ZERO_FORMULA[self.core.stage](n)
        m["model_states"] = m["params"] + m["grads"] + m["optimizer"]
        m["formula"] = (fixed + per) * m["psi"]
        m["placement"] = self.core.placement
        return m

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False, async_save=None):
        """Every rank's shard of the fp32 state, rank 0's model states (frozen
        parameters left out of them with exclude_frozen_parameters). Collective.
        async_save (default: the config's checkpoint.async): copy the state into memory,
        write the files on a background thread, commit `latest` once every rank's are written
        (at a later step, save or wait_for_checkpoint())."""
        if self._zenflow is not None:
            self._client.settle()
        return checkpoint.save(self, save_dir, tag, client_state or {}, save_latest, exclude_frozen_parameters,
                               async_save)

    def wait_for_checkpoint(self):
        """Waits for the asynchronous save in flight (if any), commits it, raises its failure. Collective."""
        checkpoint_io.wait(self)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        if self._zenflow is not None:  # (a CPU step in flight writes the state the load replaces)
            self._client.settle()
        return checkpoint.load(self, load_dir, tag, load_lr_scheduler_states)

    def module_state_dict(self):
        """The whole model's state on every rank (ZeRO-3 gathers each module's parameters
        in turn; collective over the process set at stage 3)."""
        state = self.module.state_dict(keep_vars=True)
        whole = {}
        if self._stage3 is not None:
            for m, own in self._stage3.owned.items():
                self._stage3.fetch(m)
                for i in own:
                    whole[id(self._params[i])] = self._params[i].detach().clone()
                self._stage3.release(m)
        out = {k: whole[id(v)] if id(v) in whole else v.detach().clone() for k, v in state.items()}
        if self.random_ltd_enabled():  # the plain model's names, as DeepSpeed's
            from chorus.deepspeed.runtime.data_pipeline.data_routing import remove_random_ltd_state_dict
            out = dict(remove_random_ltd_state_dict(out))
        return out

    def whole_16bit_state(self, exclude_frozen_parameters=False):
        """The plain model's weights in their training dtype: ZeRO-3's gathered, every
        expert under its global number, tensor-parallel slices joined. Collective."""
        state = self.module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return whole_model.whole_state(self.module, state, self._tp_set)

    def _writes_whole(self):
        return self.process_set.rank() == 0 and not self._mp_rank

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """Writes the plain model's weights in their training dtype from one rank (a
        torch.load-able state dict); every rank calls it."""
        state = self.whole_16bit_state(exclude_frozen_parameters)
        if self._writes_whole():
            write_state(state, save_dir, save_filename)
        hvd.barrier(process_set=self.process_set)
        if self._tp_set is not None:
            hvd.barrier(process_set=self._tp_set)
        return True

    save_fp16_model = save_16bit_model

    @property
    def basic_optimizer(self):
        return self.optimizer.basic_optimizer

    @property
    def config(self):
        """The config as a dict, as DeepSpeed's engine.config is (batch sizes resolved)."""
        raw = dict(self._raw_config)
        for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            raw[k] = self._cfg[k]
        return raw

    def zero_gather_16bit_weights_on_model_save(self):
        """Whether save_16bit_model gathers ZeRO-3 weights (stage3_gather_16bit_weights_on_model_save)."""
        zero = self._raw_config.get("zero_optimization", {})
        return bool(zero.get("stage3_gather_16bit_weights_on_model_save",
                             zero.get("stage3_gather_fp16_weights_on_model_save", False)))

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """The whole model's state in its training dtype on the set's first rank
        (None elsewhere); collective over the process set. Buffers too, and a
        parameter tied to another appears under each name, as in module.state_dict()."""
        state = self.whole_16bit_state(exclude_frozen_parameters)
        return state if self._writes_whole() else None
