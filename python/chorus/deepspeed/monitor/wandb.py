"""wandb: a Weights & Biases run (project, group, team as entity), each event logged
at its step. WANDB_MODE=offline keeps it on this machine."""
from chorus.deepspeed.monitor.base import Monitor


class WandbMonitor(Monitor):
    def __init__(self, wandb_config):
        super().__init__(wandb_config)
        try:
            import wandb
        except ImportError as e:
            raise ImportError("DeepSpeed config: 'wandb.enabled' needs the wandb package (pip install wandb): "
                              f"{e}") from None
        self.group = wandb_config.get("group")
        self.team = wandb_config.get("team")
        self.project = wandb_config.get("project", "deepspeed")
        self.run = wandb.init(project=self.project, group=self.group, entity=self.team)

    def log(self, data, step=None, commit=None):
        import wandb
        return wandb.log(data, step=step, commit=commit)

    def write_events(self, event_list):
        for name, value, step in event_list:
            self.log({name: value}, step=step)
