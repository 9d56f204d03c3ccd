"""The parts of DeepSpeed's engine API that read or change settings, and the names
chorus does not carry yet (each raises an error that says so, never AttributeError)."""
import torch

import chorus.torch as hvd


class EngineQueries:
    """Mixed into DeepSpeedEngine; reads self._cfg (parsed), self._raw_config and self.core."""

    # --- ranks and sizes ---------------------------------------------------------------------
    @property
    def global_rank(self):
        return hvd.rank()

    @property
    def world_size(self):
        return hvd.size()

    @property
    def local_rank(self):
        return hvd.local_rank()

    @property
    def dp_world_size(self):
        return self.process_set.size()

    @property
    def mp_world_size(self):
        return 1  # no model parallelism: every rank of the set holds the whole model

    # --- batch and accumulation --------------------------------------------------------------
    def gradient_accumulation_steps(self):
        return self._cfg["gradient_accumulation_steps"]

    def train_batch_size(self):
        return self._cfg["train_batch_size"]

    def train_micro_batch_size_per_gpu(self):
        return self._cfg["train_micro_batch_size_per_gpu"]

    def get_batch_info(self):
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    def set_train_batch_size(self, train_batch_size):
        """Changes the global batch by changing gradient_accumulation_steps, as DeepSpeed does."""
        per_pass = self.train_micro_batch_size_per_gpu() * self.dp_world_size
        if train_batch_size % per_pass != 0:
            raise ValueError(f"set_train_batch_size({train_batch_size}): the train batch must be a multiple of "
                             f"micro batch x data-parallel size = {per_pass}")
        self._cfg["gradient_accumulation_steps"] = train_batch_size // per_pass
        self._cfg["train_batch_size"] = train_batch_size

    def set_train_micro_batch_size(self, micro_batch_size):
        """Changes the micro batch; the global batch follows (accumulation steps stay)."""
        if micro_batch_size < 1:
            raise ValueError(f"set_train_micro_batch_size({micro_batch_size}): must be >= 1")
        self._cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
        self._cfg["train_batch_size"] = micro_batch_size * self.gradient_accumulation_steps() * self.dp_world_size

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Overrides the boundary that micro_steps would give (DeepSpeed's pipeline engine uses it)."""
        self._boundary_override = bool(is_boundary)

    def is_gradient_accumulation_boundary(self):
        if self._boundary_override is not None:
            return self._boundary_override
        if getattr(self, "_zenflow", None) is not None:
            return self._zenflow.is_boundary(self.micro_steps)
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    # --- the config's sections ---------------------------------------------------------------
    def zero_optimization(self):
        return self.core.stage > 0

    def zero_optimization_stage(self):
        return self.core.stage

    def zero_optimization_partition_gradients(self):
        return self.core.stage >= 2

    def zero_optimization_partition_weights(self):
        return self.core.stage >= 3

    def zero_offload_optimizer(self):
        return self._cfg["offload_optimizer"] in ("cpu", "nvme")

    def zero_offload_param(self):
        return self._cfg["offload_param"] in ("cpu", "nvme")

    def zero_cpu_offload(self):
        return self.zero_offload_optimizer()

    def zero_reduce_bucket_size(self):
        return self._cfg["reduce_bucket_size"]

    def zero_prefetch_bucket_size(self):
        return self._cfg["prefetch_bucket_size"]

    def zero_max_live_parameters(self):
        return self._cfg["max_live_parameters"]

    def zero_param_persistence_threshold(self):
        return self._cfg["param_persistence_threshold"]

    def fp16_enabled(self):
        return bool(self._cfg["fp16"])

    def bfloat16_enabled(self):
        return bool(self._cfg["bf16"])

    bf16_enabled = bfloat16_enabled

    def amp_enabled(self):
        return False  # chorus's config parser refuses the amp section

    def _fp16_section(self):
        section = self._raw_config.get("fp16") or {}
        return section if isinstance(section, dict) else {}

    def dynamic_loss_scale(self):
        return self.fp16_enabled() and self._fp16_section().get("loss_scale", 0) == 0

    def initial_dynamic_scale(self):
        return 2.0 ** self._fp16_section().get("initial_scale_power", 16)

    def loss_scale_window(self):
        return self._fp16_section().get("loss_scale_window", 1000)

    def gradient_clipping(self):
        return self._cfg["gradient_clipping"]

    def steps_per_print(self):
        return self._raw_config.get("steps_per_print", 10)

    def wall_clock_breakdown(self):
        # (the flops profiler turns it on, as in DeepSpeed)
        return bool(self._raw_config.get("wall_clock_breakdown", False)) or \
            bool((self._raw_config.get("flops_profiler") or {}).get("enabled", False))

    def postscale_gradients(self):
        return not self._raw_config.get("prescale_gradients", False)

    def gradient_predivide_factor(self):
        return self._raw_config.get("gradient_predivide_factor", 1.0)

    @property
    def communication_data_type(self):
        """The dtype the gradients are reduced in (under sequence parallelism the config's
        seq_parallel_communication_data_type, as DeepSpeed's engine sets it)."""
        given = self._raw_config.get("communication_data_type")
        if given is None:
            return self.dtype
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[str(given).lower()]

    @communication_data_type.setter
    def communication_data_type(self, value):
        raise ValueError("engine.communication_data_type: chorus's engine reduces in the dtype it was built with; "
                         "give 'communication_data_type' in the config instead")

    def optimizer_name(self):
        opt = self._cfg["optimizer"]
        return opt["type"] if opt is not None else type(self._client_optimizer).__name__.lower() \
            if self._client_optimizer is not None else None

    def scheduler_name(self):
        sched = self._cfg["scheduler"]
        return sched["type"] if sched is not None else None

    # Config sections: what they switch on (those chorus refuses at initialize() are off in any engine).
    def sparse_gradients_enabled(self):
        return False

    def data_efficiency_enabled(self):
        return bool((self._raw_config.get("data_efficiency") or {}).get("enabled", False))

    def pld_enabled(self):
        return False

    def eigenvalue_enabled(self):
        return False

    def flops_profiler_enabled(self):
        return bool((self._raw_config.get("flops_profiler") or {}).get("enabled", False))

    def elasticity_enabled(self):
        return False

    def use_node_local_storage(self):
        return bool((self._raw_config.get("checkpoint") or {}).get("use_node_local_storage", False))

    def load_universal_checkpoint(self):
        return bool((self._raw_config.get("checkpoint") or {}).get("load_universal", False))

    def memory_breakdown(self):
        return bool(self._raw_config.get("memory_breakdown", False))

    def sparse_attention(self):
        return None

    # --- optimizer state ---------------------------------------------------------------------
    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self):
        moms = []
        for g in self.optimizer.param_groups:
            moms.append(g["betas"] if "betas" in g else g.get("momentum"))
        return moms

    def get_type(self):
        return [type(self._client_optimizer).__name__ if self._client_optimizer is not None else
                self.optimizer_name()] * len(self.optimizer.param_groups)

    def get_global_grad_norm(self):
        return self._grad_norm

    def was_step_applied(self):
        return self._step_applied

    def destroy(self):
        """Waits for an asynchronous save in flight (collective then); the rest garbage collection frees."""
        from chorus.deepspeed.runtime.zero import checkpoint_io
        checkpoint_io.wait(self)


# Documented DeepSpeed engine names that chorus does not carry yet, and why.
UNSUPPORTED = {
    "train_batch": "pipeline parallelism (PipelineModule / PipelineEngine)",
    "eval_batch": "pipeline parallelism (PipelineModule / PipelineEngine)",
    "is_first_stage": "pipeline parallelism",
    "is_last_stage": "pipeline parallelism",
    "set_dataiterator": "pipeline parallelism",
    "no_sync": "no_sync(): gradients are reduced inside the ZeRO engine as backward runs",
    "set_data_post_process_func": "data efficiency (curriculum learning)",
    "set_custom_curriculum_learning_schedule": "curriculum learning",
    "get_pld_theta": "progressive layer drop",
    "load_moe_state_dict": "mixture of experts",
    "get_sequence_parallel_group": "sequence parallelism",
    "offload_states": "offloading states on demand (use the offload_* config sections)",
    "reload_states": "offloading states on demand (use the offload_* config sections)",
    "empty_partition_cache": "ZeRO-3's partition cache",
    "print_forward_breakdown": "the wall-clock breakdown timers",
    "clip_fp32_gradients": "clipping outside the engine (set gradient_clipping in the config)",
    "allreduce_gradients": "reducing gradients outside the engine (they are reduced in backward)",
}


def _unsupported(name, why):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"chorus's DeepSpeedEngine does not support {name}() yet: it needs {why}")
    method.__name__ = name
    return method


for _name, _why in UNSUPPORTED.items():
    setattr(EngineQueries, _name, _unsupported(_name, _why))
