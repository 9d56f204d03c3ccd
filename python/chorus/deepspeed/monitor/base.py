"""The base of every monitor (below MonitorMaster and the monitors it makes, which both
use it); deepspeed.monitor.monitor.Monitor is this class."""


class Monitor:
    """A monitor of one config section (enabled, output_path, job_name, ...)."""

    def __init__(self, monitor_config):
        self.monitor_config = monitor_config
        self.enabled = bool(monitor_config.get("enabled", False))
