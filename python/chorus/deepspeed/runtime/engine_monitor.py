"""The engine's monitor events, as DeepSpeed 0.19.8 writes them from rank 0 at each
optimizer step: Train/Samples/lr (and loss_scale under fp16), and with
wall_clock_breakdown the milliseconds spent in forward, backward (its autograd part and
its reduction part) and step since the last optimizer step, each at global_samples."""
import contextlib
import time

from chorus.deepspeed.monitor.monitor import MonitorMaster

_TIMERS = ("forward", "backward", "backward_inner", "backward_allreduce", "step")


class EngineMonitor:
    def _monitor_init(self):
        self.monitor = MonitorMaster(self._raw_config)
        self._wall = dict.fromkeys(_TIMERS, 0.0)
        self._timing = self.monitor.enabled and bool(self._raw_config.get("wall_clock_breakdown", False))

    @contextlib.contextmanager
    def _timed(self, *names):
        if not self._timing:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            ms = (time.perf_counter() - start) * 1e3
            for name in names:
                self._wall[name] += ms

    def _write_step_events(self):
        if not self.monitor.enabled:
            return
        events = [("Train/Samples/lr", self.get_lr()[0], self.global_samples)]
        if self.fp16_enabled():
            events.append(("Train/Samples/loss_scale", self.core.loss_scale, self.global_samples))
        self.monitor.write_events(events)
        if self._timing:
            self.monitor.write_events([(f"Train/Samples/elapsed_time_ms_{name}", self._wall[name], self.global_samples)
                                       for name in _TIMERS])
            self._wall = dict.fromkeys(_TIMERS, 0.0)
