"""Where the ZeRO engine keeps the model on a host with no usable GPU (or with
DS_ACCELERATOR=cpu): host memory. A move there is a no-op; a move to CUDA is
refused naming where the model is, and the model is left training."""
import sys

import torch

import chorus.deepspeed as deepspeed

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": int(sys.argv[1])}}
engine, _, _, _ = deepspeed.initialize(model=model, config_params=config)
assert engine.device == torch.device("cpu"), engine.device
assert engine.to("cpu") is engine and engine.cpu() is engine and engine.to(torch.float32) is engine
for move in (lambda: engine.cuda(), lambda: engine.to("cuda:0"), lambda: engine.to(torch.device("cuda", 1))):
    try:
        move()
        raise SystemExit("a move to CUDA was accepted")
    except ValueError as e:
        assert "keeps the model in host memory" in str(e) and "cuda" in str(e), e
before = [p.detach().clone() for p in model.parameters()]
loss = engine(torch.ones(2, 4)).sum()
engine.backward(loss)
engine.step()
assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), "the step changed nothing"
print("placement ok", flush=True)
