"""deepspeed.monitor: the monitors a config's tensorboard, csv_monitor, wandb and comet
sections switch on; the engine writes DeepSpeed's events to them from rank 0."""
