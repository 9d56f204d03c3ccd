"""Ray Train on chorus: HorovodTrainer (the trainer Ray removed) and TorchTrainer
with ChorusConfig running chorus.deepspeed (Ray's DeepSpeed recipe, import changed)."""
import os
import tempfile

import pytest
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

from chorus.ray import ChorusConfig, HorovodTrainer


def horovod_loop(config):
    import ray.train
    import chorus.torch as hvd
    hvd.init()
    ctx = ray.train.get_context()
    assert hvd.rank() == ctx.get_world_rank() and hvd.size() == ctx.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=config["lr"]),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:  # a restart after a failure goes on from the last report
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
            model.load_state_dict(state["model"])
            start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        x = torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        weights = model.weight.detach().clone()
        gathered = hvd.allgather(weights)  # every replica's weights, to compare
        replicas_equal = bool(all(torch.equal(gathered[0], row) for row in gathered))
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"epoch": epoch, "loss": loss.item(), "replicas_equal": replicas_equal,
                              "size": hvd.size()}, checkpoint=checkpoint)
        if epoch == config.get("fail_at") and hvd.rank() == 1 and not os.path.exists(config["failed_flag"]):
            open(config["failed_flag"], "w").close()
            os._exit(1)  # the worker dies; Ray Train restarts the group


def run_config(tmp_path, **kwargs):
    return RunConfig(storage_path=str(tmp_path), name="chorus", checkpoint_config=CheckpointConfig(num_to_keep=2),
                     **kwargs)


def test_horovod_trainer_reports_and_checkpoints(ray_cluster, tmp_path):
    trainer = HorovodTrainer(horovod_loop, train_loop_config={"lr": 0.05, "epochs": 3},
                             scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                             run_config=run_config(tmp_path))
    result = trainer.fit()
    assert result.error is None
    assert result.metrics["epoch"] == 2 and result.metrics["size"] == 2 and result.metrics["replicas_equal"]
    with result.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "state.pt"))["epoch"] == 2


def test_horovod_trainer_restarts_after_a_worker_dies(ray_cluster, tmp_path):
    flag = str(tmp_path / "failed-once")
    trainer = HorovodTrainer(horovod_loop,
                             train_loop_config={"lr": 0.05, "epochs": 4, "fail_at": 1, "failed_flag": flag},
                             scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                             run_config=run_config(tmp_path, failure_config=FailureConfig(max_failures=1)))
    result = trainer.fit()
    assert os.path.exists(flag)  # it did die once
    assert result.error is None and result.metrics["epoch"] == 3 and result.metrics["replicas_equal"]


def deepspeed_loop(config):
    # Ray's DeepSpeed recipe, with `import deepspeed` changed to chorus's.
    import ray.train
    import chorus.deepspeed as deepspeed
    import torch.distributed as dist
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=config["ds_config"])
    ctx = ray.train.get_context()
    assert dist.is_initialized() and dist.get_rank() == ctx.get_world_rank()
    # chorus beside torch.distributed: its own held port and a secret made for the job.
    from chorus import _core
    assert _core.is_initialized() and _core.rank() == ctx.get_world_rank() and _core.size() == 2
    assert os.environ["CHORUS_RENDEZVOUS_SERVER"] == "rank0"
    assert int(os.environ["CHORUS_RENDEZVOUS_PORT"]) != int(os.environ["MASTER_PORT"]) + 1
    assert len(os.environ["CHORUS_SECRET"]) >= 32
    g = torch.Generator().manual_seed(10 + ctx.get_world_rank())
    w = torch.arange(8, dtype=torch.float32) / 8
    losses, equal = [], True
    for _ in range(config["steps"]):
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), (x @ w).unsqueeze(1))
        engine.backward(loss)
        engine.step()
        flat = torch.cat([p.detach().float().flatten() for p in engine.module.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)  # torch.distributed, which Ray set up beside chorus
        equal &= all(torch.equal(gathered[0], t) for t in gathered)
        losses.append(loss.item())
    # Ray Train keeps the metrics that come with a checkpoint.
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if ctx.get_world_rank() == 0:
            torch.save(engine.module.state_dict(), os.path.join(d, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(d)
        ray.train.report({"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
                          "replicas_equal": equal}, checkpoint=checkpoint)


@pytest.mark.parametrize("stage", [1, 2])
def test_torch_trainer_runs_chorus_deepspeed_with_chorus_config(ray_cluster, tmp_path, stage):
    from ray.train.torch import TorchTrainer
    ds_config = {"train_micro_batch_size_per_gpu": 16, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                 "zero_optimization": {"stage": stage}}
    trainer = TorchTrainer(deepspeed_loop, train_loop_config={"ds_config": ds_config, "steps": 30},
                           torch_config=ChorusConfig(backend="gloo"),
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                           run_config=run_config(tmp_path))
    result = trainer.fit()
    assert result.error is None
    m = result.metrics
    assert m["steps"] == 30 and m["replicas_equal"]
    assert m["last_loss"] < m["first_loss"] / 2, m
