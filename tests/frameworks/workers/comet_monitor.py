"""The comet monitor (comet_ml's offline experiment: an archive under
COMET_OFFLINE_DIRECTORY) on 2 ranks: a warmup schedule, samples_log_interval 8, and a
user's own event through engine.monitor. Runs under whatever `import deepspeed` is; the
test reads both archives.

    comet_monitor.py
"""
import torch


def main():
    import deepspeed
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                        "warmup_num_steps": 6}},
           "comet": {"enabled": True, "project": "chorus-test", "online": False, "samples_log_interval": 8,
                     "experiment_name": "comet-vs-deepspeed"}}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(10):
        loss = engine(torch.randn(2, 8, generator=gen)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        engine.monitor.write_events([("Train/Samples/train_loss", loss.item(), engine.global_samples)])
    experiment = engine.monitor.comet_monitor.experiment if engine.monitor.comet_monitor is not None else None
    if experiment is not None:  # (rank 0's: the only writer)
        experiment.end()


if __name__ == "__main__":
    main()
