"""What the engine says about itself, as DeepSpeed 0.19.8 does: the monitors' events from
rank 0 at each optimizer step (Train/Samples/lr, loss_scale under fp16, and with
wall_clock_breakdown the milliseconds spent in forward, backward, its autograd and
reduction parts, and step since the last optimizer step, at global_samples), and the
flops profile of the forward passes at global step profile_step (which, as in
DeepSpeed, turns the wall-clock timers on). With autotuning enabled, the engine does
what DeepSpeed's autotuner expects of each experiment: it profiles the forward at
start_profile_step, and after end_profile_step writes the step's latency, FLOPS and
throughput to metric_path and ends the process."""
import contextlib
import json
import os
import statistics
import sys
import time

import torch

import chorus.torch as hvd
from chorus.deepspeed.monitor.monitor import MonitorMaster

_TIMERS = ("forward", "backward", "backward_inner", "backward_allreduce", "step")


class EngineMonitor:
    def _monitor_init(self):
        from chorus.deepspeed import comm
        comm.configure(self._raw_config)  # the communication logger: on when the config has comms_logger
        self.monitor = MonitorMaster(self._raw_config)
        self._wall = dict.fromkeys(_TIMERS, 0.0)
        self._fp = dict(self._raw_config.get("flops_profiler") or {})
        self._tune = dict(self._raw_config.get("autotuning") or {})
        if not self._tune.get("enabled"):
            self._tune = None
        else:  # the autotuner's profile: at its first profiled step, no printout
            self._fp.update(enabled=True, detailed=False, profile_step=int(self._tune.get("start_profile_step", 3)))
        self._records = {name: [] for name in _TIMERS}
        self._model_info = None
        if self._tune is not None and (self._tune.get("model_info") or {}).get("profile"):
            trainable = sum(int(torch.Size(s).numel()) for s in self._shapes)
            frozen = sum(p.numel() for p in self.module.parameters() if not p.requires_grad)
            tp = getattr(self, "_tp", 1)
            self._model_info = {"num_params": (trainable + frozen) * tp, "trainable_num_params": trainable * tp,
                                "activation_mem_per_gpu": 0}
        self.flops = 0
        self.flops_profiler = None
        if self._fp.get("enabled"):
            from chorus.deepspeed.profiling.flops_profiler import FlopsProfiler
            self.flops_profiler = FlopsProfiler(self.module, self, float(self._fp.get("recompute_fwd_factor", 0.0)))
        self._timing = bool(self._raw_config.get("wall_clock_breakdown", False)) or self.flops_profiler is not None

    def wall_clock_timers_ms(self):
        """The milliseconds in forward, backward (and its parts) and step since the last optimizer step."""
        return dict(self._wall)

    def _profiling(self):
        return self.flops_profiler is not None and self.global_steps == int(self._fp.get("profile_step", 1)) and \
            (not hvd.is_initialized() or hvd.rank() == 0)

    @contextlib.contextmanager
    def _profiled_forward(self):
        profiling = self._profiling()
        if profiling:
            self.flops_profiler.start_profile()
        try:
            if self._model_info is not None:  # the autotuner's model profile: what the forward keeps for backward
                with self._activation_bytes():
                    yield
            else:
                yield
        finally:
            if profiling:
                self.flops_profiler.stop_profile()

    @contextlib.contextmanager
    def _activation_bytes(self):
        params = {p.data_ptr() for p in self.module.parameters()}
        seen = set()

        def pack(t):
            key = (t.data_ptr(), t.numel(), t.dtype)
            if t.data_ptr() not in params and key not in seen:
                seen.add(key)
                self._model_info["activation_mem_per_gpu"] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def _model_info_exit(self):
        """After the first backward of a model-profile run: the model's sizes to model_info_path, and the end."""
        if not hvd.is_initialized() or hvd.rank() == 0:
            path = self._tune.get("model_info_path") or os.path.join(os.getcwd(), "autotuning_model_info.json")
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(self._model_info, f)
            os.replace(path + ".tmp", path)
        sys.exit(0)

    @contextlib.contextmanager
    def _timed(self, *names):
        if not self._timing:
            yield
            return
        sync = torch.cuda.synchronize if self._device.type == "cuda" else (lambda: None)
        sync()  # (a device's work is asynchronous: the time is the work's, not its launch's)
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            ms = (time.perf_counter() - start) * 1e3
            for name in names:
                self._wall[name] += ms
                self._records[name].append(ms)

    def _after_step(self, boundary, profiling):
        """Monitor events at an optimizer step, the flops profile of a profiled micro-step,
        then the timing events, and the timers start again at the next step."""
        from chorus.deepspeed.comm import comms_logger
        if comms_logger.enabled:  # (the op log's records into the summary's counts, step by step)
            comms_logger.drain(settle=False)
        if boundary and self.monitor.enabled:
            events = [("Train/Samples/lr", self.get_lr()[0], self.global_samples)]
            if self.fp16_enabled():
                events.append(("Train/Samples/loss_scale", self.core.loss_scale, self.global_samples))
            self.monitor.write_events(events)
        if profiling and self.flops_profiler.started and self._tune is not None:
            self.flops = self.flops_profiler.get_total_flops() * 3  # forward and backward (twice the forward)
            self.flops_profiler.end_profile()
        elif profiling and self.flops_profiler.started:
            fp = self._fp
            self.flops_profiler.print_model_profile(profile_step=self.global_steps,
                                                    module_depth=int(fp.get("module_depth", -1)),
                                                    top_modules=int(fp.get("top_modules", 1)),
                                                    detailed=bool(fp.get("detailed", True)),
                                                    output_file=fp.get("output_file"))
            self.flops_profiler.end_profile()
        if self._tune is not None and self.global_steps == int(self._tune.get("end_profile_step", 5)) + 1:
            self._autotuning_exit()
        if boundary and self._timing:
            if self.monitor.enabled:
                self.monitor.write_events([(f"Train/Samples/elapsed_time_ms_{name}", self._wall[name],
                                            self.global_samples) for name in _TIMERS])
            self._wall = dict.fromkeys(_TIMERS, 0.0)
            self._records = {name: [] for name in _TIMERS}

    def _autotuning_exit(self):
        """The experiment's metrics from rank 0 (microseconds, as DeepSpeed's): each of fwd, bwd
        and step as the trimmed mean of this step's micro-steps, the step's latency, the FLOPS per
        GPU and the samples per second; then every rank ends."""
        if not hvd.is_initialized() or hvd.rank() == 0:
            def mean_us(records):
                k = int(round(len(records) * 0.1))
                kept = sorted(records)[k:len(records) - k]
                return statistics.fmean(kept) * 1000.0 if kept else 0.0

            msg = {"fwd": mean_us(self._records["forward"]), "bwd": mean_us(self._records["backward"]),
                   "step": mean_us(self._records["step"])}
            latency = (msg["fwd"] + msg["bwd"] + msg["step"]) * self.gradient_accumulation_steps()
            msg["latency"] = latency
            msg["FLOPS_per_gpu"] = self.flops * 1_000_000 * self.gradient_accumulation_steps() / latency
            msg["throughput"] = self.train_batch_size() * 1_000_000 / latency
            msg["rank"] = hvd.rank() if hvd.is_initialized() else -1
            path = self._tune.get("metric_path") or os.path.join(os.getcwd(), "autotuning_metric.json")
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(msg, f)
            os.replace(path + ".tmp", path)
            print(f"Autotuning: wrote metrics to {os.path.abspath(path)}", flush=True)
        sys.exit(0)
