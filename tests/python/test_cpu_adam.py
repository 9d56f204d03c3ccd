"""chorus's CPU Adam against torch.optim.Adam / AdamW, step by step."""
import pytest
import torch

from chorus.cpu_adam import CPUAdamState, adam_step


@pytest.mark.parametrize("adamw,wd", [(False, 0.0), (False, 0.01), (True, 0.01)])
def test_matches_torch(adamw, wd):
    torch.manual_seed(0)
    n = 100_003  # several blocks, odd tail
    ref = torch.randn(n, requires_grad=True)
    mine = ref.detach().clone()
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)([ref], lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
                                                             weight_decay=wd)
    state = CPUAdamState(mine)
    low = torch.empty(n, dtype=torch.bfloat16)
    for _ in range(5):
        g = torch.randn(n)
        ref.grad = g.clone()
        opt.step()
        adam_step(mine, g, state, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd, adamw=adamw,
                  low_precision=low)
    assert torch.allclose(mine, ref.detach(), rtol=1e-5, atol=1e-6), (mine - ref).abs().max()
    s = opt.state[ref]
    assert torch.allclose(state.exp_avg, s["exp_avg"], rtol=1e-5, atol=1e-7)
    assert torch.allclose(state.exp_avg_sq, s["exp_avg_sq"], rtol=1e-5, atol=1e-8)
    assert torch.equal(low, mine.to(torch.bfloat16))


def test_rejects_bad_tensors():
    p = torch.zeros(4)
    with pytest.raises(ValueError):
        adam_step(p, torch.zeros(4, dtype=torch.float64), CPUAdamState(p))
    with pytest.raises(ValueError):
        adam_step(p, torch.zeros(5), CPUAdamState(p))
