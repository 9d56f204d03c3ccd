"""Accelerate with its DeepSpeed plugin over chorus.deepspeed (the alias): an MLP,
2 ranks, CPU. Prints each step's loss (averaged over the ranks); saves the state
at step SAVE; --resume loads it and runs the remaining steps; rank 0 writes
get_state_dict() at the end. --reference: one plain torch process, global batch.

    accelerate_ds.py STAGE OFFLOAD OUT [--resume] [--reference]
"""
import argparse
import os

import torch

STEPS, SAVE, MICRO, RANKS = 10, 5, 4, 2


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * MICRO * RANKS, 16, generator=g)
    y = (x[:, :4] * 2).sum(1, keepdim=True) + 0.1 * torch.randn(len(x), 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def reference(out):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data(), batch_size=MICRO * RANKS)
    for step, (x, y) in enumerate(loader, 1):
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.7f}", flush=True)
    torch.save(m.state_dict(), os.path.join(out, "final.pt"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", type=int)
    ap.add_argument("offload")
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--reference", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.reference:
        return reference(a.out)
    from accelerate import Accelerator, DeepSpeedPlugin, PartialState
    if not torch.cuda.is_available():  # Accelerate gives DeepSpeed no backend without a GPU
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
    offload = "cpu" if a.offload == "offload" else "none"
    plugin = DeepSpeedPlugin(zero_stage=a.stage, gradient_clipping=1.0, offload_optimizer_device=offload,
                             offload_param_device=offload if a.stage == 3 else "none",
                             zero3_save_16bit_model=a.stage == 3)
    acc = Accelerator(deepspeed_plugin=plugin)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data(), batch_size=MICRO)
    m, opt, loader = acc.prepare(m, opt, loader)
    ckpt = os.path.join(a.out, "state")
    start = 0
    if a.resume:
        acc.load_state(ckpt)
        start = SAVE
        loader = acc.skip_first_batches(loader, SAVE)
    for step, (x, y) in enumerate(loader, start + 1):
        loss = torch.nn.functional.mse_loss(m(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        mean = acc.gather(loss.detach().reshape(1)).mean().item()
        if acc.is_main_process:
            print(f"step {step} loss {mean:.7f}", flush=True)
        if step == SAVE and not a.resume:
            acc.save_state(ckpt)
    state = acc.get_state_dict(m)
    if acc.is_main_process:
        torch.save({k: v.float() for k, v in state.items()}, os.path.join(a.out, "final.pt"))
        print("saved", sorted(state), flush=True)
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
