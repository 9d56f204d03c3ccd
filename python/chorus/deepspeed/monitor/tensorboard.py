"""tensorboard: PyTorch's SummaryWriter under output_path/job_name, each event a scalar
(flushed after each batch of events, as DeepSpeed's)."""
import os

from chorus.deepspeed.monitor.base import Monitor


class TensorBoardMonitor(Monitor):
    def __init__(self, tensorboard_config):
        super().__init__(tensorboard_config)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("DeepSpeed config: 'tensorboard.enabled' needs the tensorboard package "
                              f"(pip install tensorboard): {e}") from None
        self.output_path = tensorboard_config.get("output_path", "")
        self.job_name = tensorboard_config.get("job_name", "DeepSpeedJobName")
        log_dir = os.path.join(self.output_path, self.job_name)
        os.makedirs(log_dir, exist_ok=True)
        self.summary_writer = SummaryWriter(log_dir=log_dir)

    def write_events(self, event_list, flush=True):
        for name, value, step in event_list:
            self.summary_writer.add_scalar(name, value, step)
        if flush:
            self.summary_writer.flush()

    def flush(self):
        self.summary_writer.flush()
