"""Spark's own TorchDistributor (it starts torchrun) runs chorus.torch and
chorus.deepspeed code unchanged: chorus takes torchrun's variables."""
import pytest
import torch

from conftest import spark_session


@pytest.fixture(scope="module", autouse=True)
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


def horovod_style(steps):
    import torch
    import chorus.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = hvd.allgather(model.weight.detach().clone())
    # TorchDistributor returns rank 0's value.
    return {"size": hvd.size(), "equal": all(torch.equal(weights[0], w) for w in weights)}


def deepspeed_style(steps):
    import torch
    import chorus.deepspeed as deepspeed
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {"train_micro_batch_size_per_gpu": 16, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": 2}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    import torch.distributed as dist
    g = torch.Generator().manual_seed(dist.get_rank())
    w = torch.arange(8, dtype=torch.float32) / 8
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), (x @ w).unsqueeze(1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return {"size": dist.get_world_size(), "equal": all(torch.equal(gathered[0], t) for t in gathered),
            "first": losses[0], "last": losses[-1]}


@pytest.mark.parametrize("local_mode", [True, False])
def test_chorus_torch_under_torch_distributor(local_mode):
    from pyspark.ml.torch.distributor import TorchDistributor
    out = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False).run(horovod_style, 10)
    assert out == {"size": 2, "equal": True}


def test_chorus_deepspeed_under_torch_distributor():
    from pyspark.ml.torch.distributor import TorchDistributor
    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(deepspeed_style, 30)
    assert out["size"] == 2 and out["equal"] and out["last"] < out["first"] / 2, out
