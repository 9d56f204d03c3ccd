"""csv_monitor: one CSV file per event under output_path/job_name, named for the event
with '/' and ' ' made '_', a header row (step, the event name's last part) first."""
import csv
import os

from chorus.deepspeed.monitor.base import Monitor


class csvMonitor(Monitor):  # noqa: N801  (DeepSpeed's name)
    def __init__(self, csv_config):
        super().__init__(csv_config)
        self.output_path = csv_config.get("output_path", "")
        self.job_name = csv_config.get("job_name", "DeepSpeedJobName")
        self.filenames = []
        self.log_dir = os.path.join(self.output_path, self.job_name)
        os.makedirs(self.log_dir, exist_ok=True)

    def write_events(self, event_list):
        for name, value, step in event_list:
            filename = name.replace("/", "_").replace(" ", "_")
            path = os.path.join(self.log_dir, filename + ".csv")
            with open(path, "a+", newline="") as f:
                writer = csv.writer(f)
                if filename not in self.filenames:
                    self.filenames.append(filename)
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, value])
