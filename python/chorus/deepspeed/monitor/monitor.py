"""MonitorMaster: every monitor the config switches on, written to from the data-parallel
set's first rank only, as DeepSpeed's. Events are (name, value, step) tuples, step being
the samples seen so far (DeepSpeed's Train/Samples/... events)."""
import chorus.torch as hvd
from chorus.deepspeed.monitor.base import Monitor


def _rank():
    return hvd.rank() if hvd.is_initialized() else 0


class MonitorMaster(Monitor):
    """monitor_config: the whole DeepSpeed config (a dict); each section it switches on
    gets its monitor on rank 0."""

    def __init__(self, monitor_config):
        super().__init__({})
        self.tb_monitor = self.wandb_monitor = self.csv_monitor = self.comet_monitor = None
        sections = {k: dict(monitor_config.get(k) or {}) for k in ("tensorboard", "wandb", "csv_monitor", "comet")}
        self.enabled = any(s.get("enabled") for s in sections.values())
        if not self.enabled or _rank() != 0:
            return
        if sections["tensorboard"].get("enabled"):
            from chorus.deepspeed.monitor.tensorboard import TensorBoardMonitor
            self.tb_monitor = TensorBoardMonitor(sections["tensorboard"])
        if sections["wandb"].get("enabled"):
            from chorus.deepspeed.monitor.wandb import WandbMonitor
            self.wandb_monitor = WandbMonitor(sections["wandb"])
        if sections["csv_monitor"].get("enabled"):
            from chorus.deepspeed.monitor.csv_monitor import csvMonitor
            self.csv_monitor = csvMonitor(sections["csv_monitor"])
        if sections["comet"].get("enabled"):
            from chorus.deepspeed.monitor.comet import CometMonitor
            self.comet_monitor = CometMonitor(sections["comet"])

    def monitors(self):
        return [m for m in (self.tb_monitor, self.wandb_monitor, self.csv_monitor, self.comet_monitor)
                if m is not None]

    def write_events(self, event_list):
        if _rank() != 0:
            return
        for m in self.monitors():
            m.write_events(event_list)
