"""comet: a comet_ml experiment (project, workspace, api_key, experiment name/key,
online or offline mode), each event a metric at its step; samples_log_interval
thins the events as DeepSpeed's does."""
from chorus.deepspeed.monitor.base import Monitor


class CometMonitor(Monitor):
    def __init__(self, comet_config):
        super().__init__(comet_config)
        try:
            import comet_ml
        except ImportError as e:
            raise ImportError("DeepSpeed config: 'comet.enabled' needs the comet_ml package (pip install comet_ml): "
                              f"{e}") from None
        self.samples_log_interval = int(comet_config.get("samples_log_interval", 100))
        settings = dict(project=comet_config.get("project"), workspace=comet_config.get("workspace"),
                        api_key=comet_config.get("api_key"), experiment_key=comet_config.get("experiment_key"),
                        mode=comet_config.get("mode"), online=comet_config.get("online"))
        self.experiment = comet_ml.start(**{k: v for k, v in settings.items() if v is not None})
        name = comet_config.get("experiment_name")
        if name is not None:
            self.experiment.set_name(name)
        self._last = {}

    def write_events(self, event_list):
        for name, value, step in event_list:
            last = self._last.get(name)
            if last is not None and step - last < self.samples_log_interval:
                continue  # (only every samples_log_interval samples per event)
            self._last[name] = step
            self.experiment.log_metric(name, value, step=step)
