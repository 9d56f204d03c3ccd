"""An engine built with no optimizer (none passed, no config section), as DeepSpeed
builds one for evaluation: forward equals the plain model's, backward runs, and
step() says why it cannot step; initialize returns None for the optimizer."""
import torch

import chorus.deepspeed as deepspeed

for stage in (0, 3):
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    model.load_state_dict(plain.state_dict())
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config={"train_batch_size": 4,
                                                                        "zero_optimization": {"stage": stage}})
    assert optimizer is None
    x = torch.randn(4, 6)
    out = engine(x)
    assert torch.allclose(out, plain(x), atol=1e-6)
    engine.backward(out.square().mean())
    try:
        engine.step()
        raise AssertionError("step() without an optimizer went through")
    except RuntimeError as e:
        assert "has no optimizer" in str(e), e
    with torch.no_grad():  # still usable after the refused step
        assert torch.allclose(engine(x), plain(x), atol=1e-6)
print("no optimizer ok", flush=True)
